"""Which files of a folder a process tree opened, as the kernel saw it (inotify), not as the compiler reports it.

A compile's own list of what it read (`-MD`) misses files an assembler `.incbin` pulls in and escapes some names;
the kernel's open events do not depend on the compiler's honesty. Events on a file's inode arrive whatever path or
mount namespace it was opened through (the sandbox binds the folder back at its own place), and they are queued
before `open` returns, so once the compiler has exited the queue holds all of them.

`Opened.files` is the set of files (paths relative to the folder) opened, or None when that cannot be known: inotify
unavailable or out of instances, or the queue overflowed: callers then treat every file of the folder as read.
Directories opened (compilers open their sources' folders) are left out: a listing shows names only, and callers key
on the folder's names anyway.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

IN_OPEN, IN_Q_OVERFLOW, IN_ISDIR = 0x20, 0x4000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_EVENT = struct.Struct("iIII")
_libc = ctypes.CDLL(None, use_errno=True)


class Opened:
    """Watch every directory under `root` while in the `with` block; `files` afterwards."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.files: set[str] | None = None
        self._fd = -1
        self._dirs: dict[int, str] = {}

    def __enter__(self) -> "Opened":
        init = getattr(_libc, "inotify_init1", None)  # (Linux only)
        self._fd = init(IN_NONBLOCK | IN_CLOEXEC) if init else -1
        if self._fd < 0:
            return self
        for folder, _, _ in os.walk(self.root):
            wd = _libc.inotify_add_watch(self._fd, os.fsencode(folder), IN_OPEN)
            if wd < 0:
                os.close(self._fd)
                self._fd = -1
                return self
            self._dirs[wd] = os.path.relpath(folder, self.root)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd < 0:
            return
        try:
            self.files = self._drain()
        finally:
            os.close(self._fd)

    def _drain(self) -> set[str] | None:
        files: set[str] = set()
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return files
            except OSError as exc:  # pragma: no cover - a read error leaves the reads unknown
                return None if exc.errno != errno.EINTR else files
            at = 0
            while at < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size: at + _EVENT.size + length].rstrip(b"\0").decode(errors="surrogateescape")
                at += _EVENT.size + length
                if mask & IN_Q_OVERFLOW or wd not in self._dirs:
                    return None
                if name and not mask & IN_ISDIR:
                    files.add(os.path.normpath(os.path.join(self._dirs[wd], name)))
