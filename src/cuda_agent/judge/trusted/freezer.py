"""The candidate's processes, held still by the trusted side between its calls (SIGSTOP and SIGCONT from outside).

While they are stopped no thread of the candidate runs: nothing can be computed between calls, nothing can slow
the machine while baselines are timed, and its memory can be read without a race (`readback.py`). Their CPU time is
read from the kernel (each process's CPU clock, which counts ended threads too), never from the candidate.

Each process is held by a pidfd from the start: signals go through it, and every read by process id is confirmed
by it afterwards, so a process that has ended is never confused with a later one given the same id (ids wrap at
`pid_max`, 32,768 on the machines here, within minutes when a dozen evaluations run at once).

Runs in the reference worker (trusted); the judge finds the processes (`descendants`) before any candidate code runs.
"""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

STOPPED = ("T", "t")  # stopped, or traced-stopped
HOLD_S = 0.0002  # a stopped process's CPU clock is final once it holds this long (its threads are off their CPUs)
SPIN_S = 0.005  # `wait_stopped` polls without sleeping this long


class CandidateGone(RuntimeError):
    """A process of the candidate ended (crashed, exited, was killed): the evaluation's verdict says how."""


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, parents before children (read from /proc, the caller's PID namespace)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo += sorted(children.get(p, []))
    return found


def namespace_pid(pid: int) -> int | None:
    """`pid`'s number in its own (innermost) PID namespace."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next((ln for ln in status.splitlines() if ln.startswith("NSpid:")), "")
    return int(line.split()[-1]) if line.split()[1:] else None


def split_worker(root: int, sandboxed: bool) -> tuple[int, list[int], list[int]]:
    """The processes under `root` (a worker's launch): the worker itself, the sandbox's launchers above it, and any
    other (started by candidate code: strays). In the sandbox the worker is the first process its namespace's init
    started (namespace PID 2); without it, `root` is the worker."""
    pids = descendants(root)
    worker = root
    if sandboxed:
        inner = [p for p in pids if namespace_pid(p) == 2 and p != root]
        if not inner:
            raise CandidateGone("the candidate's worker process was not found")
        worker = inner[0]
    launchers, p = [], parent_of(worker)
    while p is not None and worker != root and p in pids:
        launchers.append(p)
        if p == root:
            break
        p = parent_of(p)
    strays = [p for p in pids if p != worker and p not in launchers]
    return worker, launchers, strays


def thread_states(pid: int) -> list[str] | None:
    """The scheduler state of each thread of `pid` (R, S, D, T, t, Z...); None once the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return None
    states = []
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        states.append(stat[stat.rindex(")") + 2])
    return states


def process_cpu_ns(pid: int) -> int:
    """The CPU time of every thread `pid` ever had (Linux's process CPU clock of another process, CPUCLOCK_SCHED)."""
    clock = ((~pid) << 3 | 2) & 0xFFFFFFFF
    clock = clock - (1 << 32) if clock >= 1 << 31 else clock
    try:
        return time.clock_gettime_ns(clock)
    except OSError as exc:
        raise CandidateGone(f"process {pid} has ended") from exc


class Freezer:
    """Stop and resume the candidate's processes; `stop` returns once every one of their threads is stopped."""

    def __init__(self, pids: list[int], timeout_s: float = 10.0):
        self.pids, self.timeout_s = list(pids), timeout_s
        self.frozen = False
        self.fds: dict[int, int] = {}
        for pid in self.pids:
            try:
                self.fds[pid] = os.pidfd_open(pid)
            except ProcessLookupError as exc:
                self.close()
                raise CandidateGone(f"process {pid} has ended") from exc

    def _signal(self, sig: int) -> None:
        for pid in self.pids:
            try:
                signal.pidfd_send_signal(self.fds[pid], sig)
            except ProcessLookupError as exc:
                raise CandidateGone(f"process {pid} has ended") from exc

    def _confirm(self) -> None:
        """CandidateGone if any process has ended (what was read by its id may have been another's since)."""
        ended = select.select(list(self.fds.values()), [], [], 0)[0]
        if ended:
            pid = next(p for p, fd in self.fds.items() if fd in ended)
            raise CandidateGone(f"process {pid} has ended")

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.frozen = False

    def signal_stop(self) -> None:
        """Send the stop (its threads stop within microseconds); `settle` waits until they all have."""
        self._signal(signal.SIGSTOP)
        self.frozen = True

    def wait_stopped(self) -> None:
        """Wait until every thread shows stopped. A thread inside a system call that only a fatal signal interrupts
        (a long `pread`, `process_vm_readv`) goes on working in the kernel after the stop was sent: until it shows
        stopped, the call has not ended. It polls without sleeping for the first `SPIN_S` (a sleep would put off
        this process's next look by up to a scheduler tick on a busy machine, and the call's end with it)."""
        began = time.monotonic()
        deadline = began + self.timeout_s
        for pid in self.pids:
            while True:
                states = thread_states(pid)
                if states is None or "Z" in states or "X" in states:
                    raise CandidateGone(f"process {pid} has ended")
                if all(s in STOPPED for s in states):
                    self._confirm()
                    break
                now = time.monotonic()
                if now > deadline:
                    raise CandidateGone(f"process {pid} did not stop within {self.timeout_s:.0f} s")
                if now - began > SPIN_S:
                    time.sleep(0.00002)

    def settle(self) -> None:
        """Wait until every thread shows stopped and then until their CPU clocks hold still: a thread shows `T` as
        soon as it takes the stop, before it leaves its CPU, and the kernel adds the time it ran since its last
        tick (up to a tick, ~4 ms) only when it leaves; a clock read in between moves later, while stopped (the
        likely cause of the H200's rare "ran while stopped" on honest kernels: 3,050 us in one gap of ~2,700)."""
        self.wait_stopped()
        deadline = time.monotonic() + self.timeout_s
        cpu = self.cpu_by_pid()
        while time.monotonic() < deadline:  # (past it, whatever moves is the candidate's to explain)
            time.sleep(HOLD_S)
            cpu, before = self.cpu_by_pid(), cpu
            if cpu == before:
                return

    def stop(self) -> None:
        self.signal_stop()
        self.settle()

    def switches(self) -> int | None:
        """How many times the scheduler has given the candidate's threads a CPU (their schedstat counts, summed;
        a stopped thread is given none); None where the kernel does not count (no schedstat, or zeros)."""
        total = 0
        for pid in self.pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except FileNotFoundError:
                return None
            for tid in tids:
                try:
                    total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[2])
                except (OSError, IndexError, ValueError):
                    return None
        self._confirm()
        return total or None

    def cpu_ns(self) -> int:
        """The CPU time of all the candidate's processes so far (exact while they are stopped)."""
        return sum(self.cpu_by_pid().values())

    def cpu_by_pid(self) -> dict[int, int]:
        """The CPU time of each of the candidate's processes so far."""
        cpu = {pid: process_cpu_ns(pid) for pid in self.pids}
        self._confirm()
        return cpu

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
