"""A size budget for the judge's build caches: compiled objects (`build/objects`), published `load_inline`
libraries (`extensions/<key>/`) and the logs of failed ones (`extensions/failed`).

Both grow by an entry for every distinct source built, for good: an RL run judges thousands of candidates a day.
Entries are touched when used (a cached object, a published library), and once the two caches together hold more
than the budget the least recently used entries go, down to `TRIM_TO` of it. An entry used within `GRACE_S` is
never removed (a build in flight may be about to link the object or copy the library), nor a library whose lock is
held (it is being published). Several judges may share a cache: what another removed first is skipped. The
precompiled header (`build/pch`, one per toolchain) and torch's own caches are not counted.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

GRACE_S = 900.0  # an entry used this recently stays, whatever the budget (a build links its cached objects within
# its budget, 600 s by default; a library is copied the moment it is found)
TRIM_TO = 0.8  # a trim goes down to this share of the budget (so that it does not run after every build)
EVERY_S = 300.0  # a judge looks at its cache's size at most this often
KEY = re.compile(r"[0-9a-f]{64}")  # a published library's folder (`InlineBuilder.key`)


@dataclass
class Trimmed:
    total_bytes: int  # both caches, before
    removed: int = 0  # entries
    freed_bytes: int = 0


def touch(path: Path) -> None:
    """Mark a cache entry used now (its modification time is its last use)."""
    try:
        os.utime(path)
    except OSError:  # removed meanwhile by another judge's trim: used from the copy already made, or rebuilt
        pass


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return path.stat().st_size


def entries(cache_dir: Path) -> list[tuple[float, int, Path]]:
    """Every entry of the two caches as (last use, bytes, path)."""
    found = []
    extensions = Path(cache_dir) / "extensions"
    candidates = [*(Path(cache_dir) / "build" / "objects").glob("*.o"), *(extensions / "failed").glob("*.log"),
                  *(p for p in extensions.glob("*") if KEY.fullmatch(p.name) and p.is_dir())]
    for path in candidates:
        try:
            found.append((path.stat().st_mtime, _size(path), path))
        except OSError:  # removed meanwhile
            continue
    return found


def _used_since(path: Path, cutoff: float) -> bool:
    """Whether the entry was used after `cutoff` (read again now: the trim's listing may be seconds old)."""
    try:
        return path.stat().st_mtime > cutoff
    except FileNotFoundError:
        return False


def _remove(path: Path, cutoff: float = float("inf")) -> bool:
    """Remove an entry unless it was used after `cutoff` (held out, red team 2026-12-06: an entry a build touched
    after the trim listed it was removed by the listed time, and that build's link, or its library's copy, failed).
    A library is looked at again under its lock, which `InlineBuilder.build` holds while it touches it."""
    if not path.is_dir() or path.is_symlink():
        if _used_since(path, cutoff):
            return False
        try:
            path.unlink()
            return True
        except FileNotFoundError:
            return False
    with open(path.parent / f"{path.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # being published (or checked) right now
            return False
        if _used_since(path, cutoff):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True


def trim(cache_dir: Path, budget_bytes: int, grace_s: float = GRACE_S, now: float | None = None) -> Trimmed:
    """Remove the least recently used entries while the caches hold more than `budget_bytes` (down to `TRIM_TO`
    of it), none used within `grace_s`."""
    now = time.time() if now is None else now
    found = sorted(entries(cache_dir), key=lambda entry: entry[0])
    result = Trimmed(sum(size for _, size, _ in found))
    if result.total_bytes <= budget_bytes:
        return result
    held = result.total_bytes
    for used, size, path in found:
        if held <= budget_bytes * TRIM_TO or used > now - grace_s:
            break
        if _remove(path, now - grace_s):
            held -= size
            result.removed += 1
            result.freed_bytes += size
    return result


class CacheKeeper:
    """One judge's look at its cache's size after its evaluations: at most every `EVERY_S`, in a thread of its own
    (a trim reads every entry's size)."""

    def __init__(self, cache_dir: Path, budget_gb: float | None):
        self.cache_dir, self.budget_gb = Path(cache_dir), budget_gb
        self.last = float("-inf")
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.last_trim: Trimmed | None = None

    def tick(self) -> None:
        with self.lock:
            if self.budget_gb is None or time.monotonic() - self.last < EVERY_S:
                return
            if self.thread is not None and self.thread.is_alive():
                return
            self.last = time.monotonic()
            self.thread = threading.Thread(target=self._trim, name="cache-trim", daemon=True)
            self.thread.start()

    def _trim(self) -> None:
        self.last_trim = trim(self.cache_dir, int(self.budget_gb * 2**30))
