"""A control group per sandboxed launch: caps the process count (fork bombs) and memory (host OOM), and kills
everything in it at the end; where asked and the `cpu` controller is writable, gives it a low CPU weight (the agent's
commands: beside a timed candidate they yield the CPU). cgroup v2 (unified) or v1 (`pids`
and `memory` hierarchies, `cpu`); needs write access to the hierarchy (root, or a delegated subtree). Where neither
is writable, `Cgroup.create` returns None.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_counter = itertools.count()
LOW_WEIGHT = {1: 50, 2: 5}  # cpu.shares (v1, ordinary 1024) and cpu.weight (v2, ordinary 100) of a low group


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def members(directory: Path) -> list[int]:
    """Every process in the group and in the groups below it: a process inside can make a subgroup (a cgroup
    mounted in a namespace of its own) and move there, out of the group's own `cgroup.procs`."""
    found = []
    for folder, _, _ in os.walk(directory):
        try:
            found += [int(p) for p in (Path(folder) / "cgroup.procs").read_text().split()]
        except OSError:
            continue
    return found


def _set_low(group: Path, version: int) -> bool:
    """A twentieth of the CPU weight of an ordinary process (`LOW_WEIGHT`): under contention it yields, never
    starves (SCHED_IDLE would leave an agent's compile to its timeout on a busy machine)."""
    try:
        _write(group / ("cpu.weight" if version == 2 else "cpu.shares"), str(LOW_WEIGHT[version]))
        return True
    except OSError:
        return False


class Cgroup:
    """One group, possibly split over v1 hierarchies; `procs` are the files a process joins by writing its pid."""

    def __init__(self, version: int, dirs: list[Path]):
        self.version, self.dirs = version, dirs
        self.low = False  # at a low CPU weight

    @property
    def procs(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    @staticmethod
    def layout() -> tuple[int, dict[str, Path]] | None:
        """(version, {controller: parent directory}) where pids and memory can be limited here, else None."""
        controllers = ROOT / "cgroup.controllers"
        if controllers.exists():
            enabled = (ROOT / "cgroup.subtree_control").read_text().split()
            if {"pids", "memory"} <= set(enabled) and os.access(ROOT, os.W_OK):
                return 2, {"pids": ROOT, "memory": ROOT}
            return None
        parents = {c: ROOT / c for c in ("pids", "memory")}
        if all((p / "cgroup.procs").exists() and os.access(p, os.W_OK) for p in parents.values()):
            return 1, parents
        return None

    @staticmethod
    def cpu_parent(version: int) -> Path | None:
        """Where the `cpu` controller can be set for a new group here (None: nowhere)."""
        if version == 2:
            return ROOT if "cpu" in (ROOT / "cgroup.subtree_control").read_text().split() else None
        return ROOT / "cpu" if os.access(ROOT / "cpu", os.W_OK) and (ROOT / "cpu" / "cpu.shares").exists() else None

    @classmethod
    def create(cls, max_processes: int, memory_bytes: int, cpu_low: bool = False) -> Cgroup | None:
        found = cls.layout()
        if found is None:
            return None
        version, parents = found
        cpu = cls.cpu_parent(version) if cpu_low else None
        if cpu is not None:
            parents = {**parents, "cpu": cpu}
        name = f"cuda-agent-{os.getpid()}-{next(_counter)}"
        dirs = sorted({p / name for p in parents.values()})
        group = cls(version, [])
        try:
            for d in dirs:
                d.mkdir()
                group.dirs.append(d)
            pids_dir, mem_dir = parents["pids"] / name, parents["memory"] / name
            _write(pids_dir / "pids.max", str(max_processes))
            if version == 2:
                _write(mem_dir / "memory.max", str(memory_bytes))
                if (mem_dir / "memory.swap.max").exists():
                    _write(mem_dir / "memory.swap.max", "0")
            else:
                _write(mem_dir / "memory.limit_in_bytes", str(memory_bytes))
            if cpu is not None:
                group.low = _set_low(cpu / name, version)
        except OSError:
            group.close()
            return None
        return group

    def events(self) -> list[str]:
        """Limits that were hit, for the failure reason."""
        notes = []
        for d in self.dirs:
            for fname, key, text in (("pids.events", "max", "process limit reached"),
                                     ("memory.events", "oom_kill", "killed by the memory limit"),
                                     ("memory.oom_control", "oom_kill", "killed by the memory limit")):
                try:
                    fields = dict(line.split() for line in (d / fname).read_text().splitlines() if line.strip())
                except (OSError, ValueError):
                    continue
                if int(fields.get(key, 0)) > 0 and text not in notes:
                    notes.append(text)
        return notes

    def close(self) -> None:
        """Kill whatever is left in the group (subgroups included) and remove it, the deepest groups first."""
        for d in self.dirs:
            for _ in range(50):
                pids = members(d)
                if not pids:
                    break
                if self.version == 2 and (d / "cgroup.kill").exists():
                    _write(d / "cgroup.kill", "1")
                else:
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                time.sleep(0.02)
            for folder in sorted((Path(f) for f, _, _ in os.walk(d)), key=lambda f: -len(f.parts)):
                for _ in range(50):
                    try:
                        folder.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.02)
