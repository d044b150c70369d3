"""Who may use a device when: timing alone (`exclusive`), other device work side by side (`shared`: verification,
the reference's first runs of `Model` and of torch.compile). A waiting exclusive holder goes first, so shared work
cannot starve timing, and no timed run ever overlaps another process's kernels. The thread holding it exclusively
may enter it again either way (an evaluation judged alone from start to end)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class DeviceLock:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # exclusive holders waiting
        self._owner: int | None = None  # the thread holding it exclusively

    def _owned(self) -> bool:
        return self._owner == threading.get_ident()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if self._owned():
            yield
            return
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            self._waiting -= 1
            self._exclusive, self._owner = True, threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive, self._owner = False, None
                self._cond.notify_all()

    @contextmanager
    def shared(self) -> Iterator[None]:
        if self._owned():
            yield
            return
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and self._waiting == 0)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()
