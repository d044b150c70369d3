"""Who may use a device when: timing alone (`exclusive`), other device work side by side (`shared`: verification,
the reference's first runs of `Model` and of torch.compile). A waiting exclusive holder goes first, so shared work
cannot starve timing, and no timed run ever overlaps another process's kernels. The thread holding it exclusively
may enter it again either way (an evaluation judged alone from start to end). `seconds()` says how the device's
time went: held exclusively, held shared, draining (shared holders finishing while an exclusive one waits and new
shared ones are held back) and free."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator


class DeviceLock:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # exclusive holders waiting
        self._owner: int | None = None  # the thread holding it exclusively
        self._seconds = dict.fromkeys(("exclusive", "shared", "draining", "free"), 0.0)
        self._since = time.monotonic()

    def seconds(self) -> dict[str, float]:
        """Seconds spent in each state since the lock was made."""
        with self._cond:
            self._account()
            return dict(self._seconds)

    def _account(self) -> None:
        """Charge the time since the last change to the state the lock was in (called holding the condition)."""
        now = time.monotonic()
        state = "exclusive" if self._exclusive else "free" if not self._shared else \
            "draining" if self._waiting else "shared"
        self._seconds[state] += now - self._since
        self._since = now

    def _owned(self) -> bool:
        return self._owner == threading.get_ident()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if self._owned():
            yield
            return
        with self._cond:
            self._account()
            self._waiting += 1
            self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            self._account()
            self._waiting -= 1
            self._exclusive, self._owner = True, threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                self._account()
                self._exclusive, self._owner = False, None
                self._cond.notify_all()

    @contextmanager
    def shared(self) -> Iterator[None]:
        if self._owned():
            yield
            return
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and self._waiting == 0)
            self._account()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._account()
                self._shared -= 1
                self._cond.notify_all()
