"""The disk an episode's workspace may hold. `bash` writes there (and in its private /tmp, which lives in memory and is
bounded by the command's memory limit); without a bound one command fills the machine's disk for every episode and
the judge beside it (held out, red team 2026-12-05: 32 GiB a file, any number of files).

While a command runs its workspace is measured every `POLL_S` (with the files its processes hold open after removing
their names: `held_unlinked`) and the command is killed past `WORKSPACE_BYTES` (or `MAX_ENTRIES` files and folders,
or a folder it cannot measure); afterwards, a workspace still over either is brought back under them by
removing its largest files (or, for the count, its newest), and the agent is told which.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

WORKSPACE_BYTES = 512 << 20  # sources, a build's objects and a few inputs fit many times over
MAX_ENTRIES = 20_000  # files and folders (measuring a workspace must stay cheap)
FILE_BYTES = 256 << 20  # one file (the sandbox's limit on what a command writes)
MEMORY_BYTES = 8 << 30  # a command's memory, its private /tmp included
POLL_S = 0.5
MAX_DEPTH = 256  # folders one inside the other (only those on the way down are held open while measuring)
MAX_HELD = 100_000  # open files and mappings of a command's processes looked at per measurement


@dataclass
class Usage:
    bytes: int = 0  # on disk (allocated blocks: a sparse file counts what it holds)
    entries: int = 0
    files: list[tuple[int, float, Path]] | None = None  # (bytes, modified, path) when asked for
    unreadable: str | None = None  # a folder or file the walk could not measure (what and why)
    blocked: list[Path] = field(default_factory=list)  # folders it could not open or look into (relative)
    too_deep: list[Path] = field(default_factory=list)  # folders below MAX_DEPTH (relative): not walked

    def over(self) -> str | None:
        """Why the workspace is over its budget (None: it is not)."""
        if self.unreadable:
            return f"the workspace holds what cannot be measured ({self.unreadable})"
        if self.bytes > WORKSPACE_BYTES:
            return f"the workspace holds {self.bytes >> 20} MiB (at most {WORKSPACE_BYTES >> 20} MiB)"
        if self.entries > MAX_ENTRIES:
            return f"the workspace holds more than {MAX_ENTRIES} files and folders"
        return None


def usage(root: Path, with_files: bool = False) -> Usage:
    """The workspace's size, links not followed. The walk stops a little past the entry limit (past four times it
    when its files are listed: what `enforce` removes from). Folders are opened one below the other, never by their
    whole path, and only those on the way down stay open (held out, red team 2026-12-06: files below a path longer
    than PATH_MAX were not counted: 1.5 GiB a command, never removed); a folder that cannot be read, or deeper than
    `MAX_DEPTH`, makes the workspace over its budget."""
    found = Usage(files=[] if with_files else None)
    stop = (4 if with_files else 1) * MAX_ENTRIES + 1
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return found

    def short(where: Path) -> str:  # (a path may be kilobytes long: what the agent is told stays short)
        rel = str(where.relative_to(root))
        return rel if len(rel) <= 120 else f"...{rel[-100:]}"

    def blocked(where: Path, exc: OSError) -> None:
        found.unreadable = found.unreadable or f"{short(where)}: {exc.strerror}"
        found.blocked.append(where.relative_to(root))

    stack: list[tuple[int, Path, object]] = []
    try:
        try:
            stack.append((top, Path(root), os.scandir(top)))
        except OSError as exc:
            os.close(top)
            blocked(Path(root), exc)
            return found
        while stack:
            fd, path, entries = stack[-1]
            entry = next(entries, None) if found.entries <= stop else None
            if entry is None:
                entries.close()
                os.close(fd)
                stack.pop()
                continue
            found.entries += 1
            try:
                info = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:  # removed meanwhile
                continue
            except OSError as exc:
                blocked(path, exc)
                continue
            found.bytes += info.st_blocks * 512
            if not stat.S_ISDIR(info.st_mode):
                if with_files:
                    found.files.append((info.st_blocks * 512, info.st_mtime, path / entry.name))
                continue
            if len(stack) >= MAX_DEPTH:
                deep = path / entry.name
                found.unreadable = found.unreadable or f"{short(deep)}: more than {MAX_DEPTH} folders deep"
                found.too_deep.append(deep.relative_to(root))
                continue
            try:
                below = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                blocked(path / entry.name, exc)
                continue
            try:
                stack.append((below, path / entry.name, os.scandir(below)))
            except OSError as exc:
                os.close(below)
                blocked(path / entry.name, exc)
    finally:
        for fd, _, entries in stack:
            entries.close()
            os.close(fd)
    return found


def held_unlinked(pids: list[int], device: int) -> int:
    """Bytes of files on `device` that `pids` hold open (or mapped) after their last name was removed: on the disk,
    in no folder (held out, red team 2026-12-06: 2 GiB held by a command whose workspace measured 0)."""
    seen: dict[tuple[int, int], int] = {}
    looked = 0
    for pid in pids:
        for folder in (f"/proc/{pid}/fd", f"/proc/{pid}/map_files"):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            looked += len(names)
            if looked > MAX_HELD:  # (measuring must stay cheap: that many open files is over the budget too)
                return WORKSPACE_BYTES + 1
            for name in names:
                try:
                    info = os.stat(f"{folder}/{name}")
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and info.st_dev == device:
                    seen[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    return sum(seen.values())


def _at(root: Path, rel: Path) -> int:
    """A descriptor of the folder holding `rel`, reached one folder at a time, links not followed."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in rel.parts[:-1]:
        try:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = below
    return fd


def _open_up(root: Path, rel: Path) -> None:
    """Give a folder the agent closed to its owner (the judge's user) its rights back: only once the command's
    processes are gone, the folder reached without following a link."""
    if not rel.parts:
        return
    try:
        parent = _at(root, rel)
        try:
            fd = os.open(rel.parts[-1], os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
        finally:
            os.close(parent)
        try:
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
        finally:
            os.close(fd)
    except OSError:
        pass


def enforce(root: Path, keep: tuple[str, ...] = ()) -> list[str]:
    """Bring the workspace under its budget: the largest files go first, then, for too many entries, the newest;
    never the files in `keep` (relative paths: the task, the template). Returns what was removed, as relative
    paths (folders stay: a workspace of too many empty folders stays over, and its next command is stopped).
    Run only when no command of the agent runs (folders it closed are opened again first)."""
    now = usage(root, with_files=True)
    if now.over() is None:
        return []
    pruned: list[str] = []
    if now.blocked or now.too_deep:
        for rel in now.blocked:
            _open_up(Path(root), rel)
        for rel in now.too_deep:  # (removed whole, by descriptors: its path may pass PATH_MAX)
            try:
                parent = _at(Path(root), rel)
            except OSError:
                continue
            try:
                shutil.rmtree(rel.parts[-1], dir_fd=parent, ignore_errors=True)
                pruned.append(f"{rel}/")
            finally:
                os.close(parent)
        now = usage(root, with_files=True)
    kept = {Path(root) / name for name in keep}
    files = [f for f in now.files if f[2] not in kept]
    removed: list[Path] = []

    def remove(path: Path) -> None:
        rel = path.relative_to(root)
        try:
            fd = _at(Path(root), rel)
        except OSError:
            return
        try:
            os.unlink(rel.parts[-1], dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
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
    return pruned + [str(path.relative_to(root)) for path in removed]
