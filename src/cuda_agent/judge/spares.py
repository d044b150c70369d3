"""Spare candidate workers: processes started before their evaluation is known, each used by one evaluation.

A candidate worker's start-up (Python, torch, torch._dynamo, the device's context: seconds) used to sit on every
evaluation's critical path once the reference worker stayed warm. A spare is started in a run folder of its own
(`Slot`), in the sandbox that folder's evaluation will have, and does that start-up before any candidate exists;
the evaluation then fills the folder (build, task file, public weights) and sends the worker its request. Nothing
of a candidate is ever in a spare before its request, and no worker serves two evaluations.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .wire.process import WorkerProcess


@dataclass
class Slot:
    """One evaluation's folders and its candidate worker (started, waiting for its request)."""
    run_dir: Path
    worker: WorkerProcess

    def close(self, keep: bool) -> None:
        self.worker.close()
        if not keep:
            shutil.rmtree(self.run_dir, ignore_errors=True)


class Spares:
    """Up to `count` slots started ahead; `take` gives a started one, or starts one now."""

    def __init__(self, count: int, runs: Path, start: Callable[[Path], WorkerProcess]):
        """`start(run_dir)` starts a spare candidate worker for that folder."""
        self.count, self.runs, self._start = count, Path(runs), start
        self._ready: list[Slot] = []
        self._lock = threading.Lock()
        self._closed = False

    def _new(self) -> Slot:
        run_dir = Path(tempfile.mkdtemp(prefix="eval-", dir=self.runs))
        for sub in ("candidate", "build", "public", "task"):
            (run_dir / sub).mkdir()
        return Slot(run_dir, self._start(run_dir))

    def take(self) -> Slot:
        with self._lock:
            while self._ready:
                slot = self._ready.pop(0)
                if slot.worker.proc.poll() is None:
                    return slot
                slot.close(keep=False)  # died while waiting (killed from outside): never hand it out
        return self._new()

    def top_up(self) -> None:
        """Start spares until `count` wait (called as an evaluation starts on a GPU, and when one ends: more are
        likely to follow)."""
        with self._lock:
            while not self._closed and len(self._ready) < self.count:
                self._ready.append(self._new())

    def discard(self) -> None:
        """Stop the spares waiting (their sandbox's view changed): the next ones start with the new view."""
        with self._lock:
            slots, self._ready = self._ready, []
        for slot in slots:
            slot.close(keep=False)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.discard()
