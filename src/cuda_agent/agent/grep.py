"""The `grep` tool's search, run in a process of its own.

Python's `re` holds the GIL for as long as a pattern backtracks (`(a+)+b` on 40 characters: hours), and a
workspace of short lines gives millions of hits: in the trainer's process either would stop every episode, the
sampler and verl's event loop with it. Here a search is bounded by a timeout and a CPU limit (which ends the child
even when its parent is gone), and keeps only the first hits (the rest are counted).
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 10
KEEP = 300  # hits kept; the others are counted


class SearchFailed(Exception):
    pass


def search(pattern: str, root: Path, files: list[Path], max_bytes: int, timeout_s: float,
           env: dict[str, str]) -> tuple[list[str], int]:
    """`pattern` over `files` (each named relative to `root`; one larger than `max_bytes` is named, not searched):
    the first `KEEP` hits as `path:line: text`, and how many more there were."""
    job = json.dumps([pattern, str(root), [str(f) for f in files], max_bytes, timeout_s])
    try:
        done = subprocess.run([sys.executable, "-m", __name__], input=job, capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise SearchFailed(f"grep stopped after {timeout_s:g} s (a pattern that backtracks, or too much to search)")
    if done.returncode != 0:
        raise SearchFailed(f"grep failed: {(done.stderr.strip().splitlines() or [f'exit {done.returncode}'])[-1]}")
    hits, more = json.loads(done.stdout)
    return hits, more


def _main() -> None:
    pattern, root, files, max_bytes, timeout_s = json.loads(sys.stdin.read())
    cpu = int(timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    regex, hits, more = re.compile(pattern), [], 0

    def hit(text: str) -> None:
        nonlocal more
        if len(hits) < KEEP:
            hits.append(text)
        else:
            more += 1

    for name in files:
        rel = os.path.relpath(name, root)
        try:
            if os.stat(name).st_size > max_bytes:
                hit(f"{rel}: larger than {max_bytes >> 20} MiB, not searched")
                continue
            with open(name, errors="replace") as lines:
                for number, line in enumerate(lines, 1):
                    line = line.rstrip("\n")
                    if regex.search(line):
                        hit(f"{rel}:{number}: {line}")
        except OSError as exc:
            hit(f"{rel}: {exc.strerror}")
    print(json.dumps([hits, more]))


if __name__ == "__main__":
    _main()
