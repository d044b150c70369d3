"""Parsing Python from many threads at once (a judge pool parses tasks and candidates on every thread)."""

import gc
import threading
from pathlib import Path

from cuda_agent.pyparse import parse

SOURCE = (Path(__file__).resolve().parents[1] / "src/cuda_agent/judge/judge.py").read_text()


def test_a_parse_interrupted_by_another_threads_parse_still_succeeds():
    # CPython 3.11 converts the tree to objects with an interpreter-wide depth counter. Here a collection during
    # thread A's conversion runs a finaliser that lets thread B parse meanwhile: with plain ast.parse, A then raises
    # "SystemError: AST constructor recursion depth mismatch" (seen in a fresh clone's pool tests).
    errors: list[str] = []
    inside = threading.Event()

    class Finalised:
        def __init__(self):
            self.me = self  # a cycle: only a collection frees it

        def __del__(self):
            if inside.is_set() and threading.current_thread() is parser:
                inside.clear()
                other = threading.Thread(target=run, args=(1,))
                other.start()
                other.join(timeout=0.2)  # a parse that waits for A's to end cannot end now

    def run(rounds: int) -> None:
        for _ in range(rounds):
            try:
                if threading.current_thread() is parser:
                    for _ in range(20):
                        Finalised()
                    inside.set()
                assert len(parse(SOURCE).body) > 10
            except Exception as exc:  # noqa: BLE001 (the failure under test)
                errors.append(repr(exc))
            finally:
                inside.clear()

    collecting = gc.isenabled()
    gc.enable()
    try:
        parser = threading.Thread(target=run, args=(8,))
        parser.start()
        parser.join()
    finally:
        if not collecting:
            gc.disable()
    assert errors == []
