"""The disk an episode's workspace may hold. `bash` writes there (and in its private /tmp, which lives in memory and is
bounded by the command's memory limit); without a bound one command fills the machine's disk for every episode and
the judge beside it (held out, red team 2026-12-05: 32 GiB a file, any number of files).

While a command runs its workspace is measured every `POLL_S` and the command is killed past `WORKSPACE_BYTES`
(or `MAX_ENTRIES` files and folders); afterwards, a workspace still over either is brought back under them by
removing its largest files (or, for the count, its newest), and the agent is told which.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

WORKSPACE_BYTES = 512 << 20  # sources, a build's objects and a few inputs fit many times over
MAX_ENTRIES = 20_000  # files and folders (measuring a workspace must stay cheap)
FILE_BYTES = 256 << 20  # one file (the sandbox's limit on what a command writes)
MEMORY_BYTES = 8 << 30  # a command's memory, its private /tmp included
POLL_S = 0.5


@dataclass
class Usage:
    bytes: int = 0  # on disk (allocated blocks: a sparse file counts what it holds)
    entries: int = 0
    files: list[tuple[int, float, Path]] | None = None  # (bytes, modified, path) when asked for

    def over(self) -> str | None:
        """Why the workspace is over its budget (None: it is not)."""
        if self.bytes > WORKSPACE_BYTES:
            return f"the workspace holds {self.bytes >> 20} MiB (at most {WORKSPACE_BYTES >> 20} MiB)"
        if self.entries > MAX_ENTRIES:
            return f"the workspace holds more than {MAX_ENTRIES} files and folders"
        return None


def usage(root: Path, with_files: bool = False) -> Usage:
    """The workspace's size, links not followed. The walk stops a little past the entry limit (past four times it
    when its files are listed: what `enforce` removes from)."""
    found = Usage(files=[] if with_files else None)
    stop = (4 if with_files else 1) * MAX_ENTRIES + 1
    todo = [Path(root)]
    while todo and found.entries <= stop:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    found.entries += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:  # removed meanwhile
                        continue
                    found.bytes += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(Path(entry.path))
                    elif with_files:
                        found.files.append((info.st_blocks * 512, info.st_mtime, Path(entry.path)))
        except OSError:
            continue
    return found


def enforce(root: Path, keep: tuple[str, ...] = ()) -> list[str]:
    """Bring the workspace under its budget: the largest files go first, then, for too many entries, the newest;
    never the files in `keep` (relative paths: the task, the template). Returns what was removed, as relative
    paths (folders stay: a workspace of too many empty folders stays over, and its next command is stopped)."""
    now = usage(root, with_files=True)
    if now.over() is None:
        return []
    kept = {Path(root) / name for name in keep}
    files = [f for f in now.files if f[2] not in kept]
    removed: list[Path] = []

    def remove(path: Path) -> None:
        path.unlink(missing_ok=True)
        removed.append(path)
        now.entries -= 1

    for size, _, path in sorted(files, key=lambda f: -f[0]):
        if now.bytes <= WORKSPACE_BYTES:
            break
        remove(path)
        now.bytes -= size
    gone = set(removed)
    for _, _, path in sorted((f for f in files if f[2] not in gone), key=lambda f: -f[1]):
        if now.entries <= MAX_ENTRIES:
            break
        remove(path)
    return [str(path.relative_to(root)) for path in removed]
