"""Where the candidate's CPU time goes, seen from outside its process (the cpu backend's trusted path, strict).

The in-process op audit (a profiler in the candidate's own process) says whether `forward` computed with torch's
ops; a candidate that rewrites the harness's report passes it. This sampler is the trusted side's own view: a
`perf_event_open` task-clock event on every thread of the candidate's worker and every CPU, opened by the reference
worker before the first call (the candidate stopped) and kept until its calls end, inherited by every thread it
starts, samples the instruction pointer every `PERIOD_NS` of a thread's CPU time (the kernel's interrupt, which
nothing in the process can switch off: `PR_TASK_PERF_EVENTS_DISABLE` only reaches events the caller created). The
candidate runs only in its calls (it is stopped between them), so every call is watched, timed ones too, and the
period runs on across calls (short calls add up). After each call (stopped) its samples are placed by the file their
address maps (`/proc/PID/maps`):

- `own`: the libraries the judge built for it (its build folder, read-only to it);
- `foreign`: compute it did not write: torch's and its math libraries, and anything not named below (a copy of
  torch's library under another name, code generated at run time);
- `interpreter`: Python, torch's Python binding and the C/C++ and OpenMP runtimes (calls, allocation, copies of
  arguments, scheduling threads).

Sampling slows what it watches (each interrupt costs ~20 us of a thread's time in this VM, so 50 us cost 40%;
`benchmarks/cpu_sampler_overhead.py`), so the period is long and the baseline callee is watched the same way beside
the candidate (its samples judge nothing): both pay the same share. Watching only some calls, as before, let a
candidate tell them while they ran (red team E: the interrupts as gaps in a spin) and use torch in the others.

The rule (strict): more than `FOREIGN_SHARE` of the compiled-code samples (own or foreign: the runtimes aside)
foreign, and more than `FOREIGN_OF_ALL` of all samples, is torch compute. The allowed ops (allocation, views, fills,
copies) do not come near it in a candidate that computes its outputs itself (an honest kernel of the tests: 15%;
torch's ops in `forward`: 100%), and a candidate that pads its share to pass spends at least as much time again as
the torch compute it hides: what torch's kernels could win it is bounded by that.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import resource
import struct
from pathlib import Path

PERIOD_NS = 1_000_000  # a sample per ms of a thread's CPU time (every call is watched, timed ones too)
FOREIGN_SHARE = 0.8  # the share of the calls' compiled-code samples in foreign code beyond which it is torch compute
FOREIGN_OF_ALL = 0.5  # ... and of all its samples: a candidate whose only compiled code is allowed ops (allocation,
# fills: a constant output) spends its calls in the interpreter, where torch's compute in `forward` spends them in
# torch (77% of all samples in the tests' attack)
MIN_SAMPLES = 20  # fewer compiled-code samples decide nothing (an honest kernel at 40% foreign passes 20 samples
# past 80% with probability 1e-4; the tests' at 15%, never)
RING_PAGES = 16  # each thread's ring of samples (read after every call: 4,096 samples of 16 bytes, 4 s of a
# thread's CPU time on one CPU in one call; samples it loses beyond that count as foreign)
LOST = "[lost: the ring was full]"
INTERPRETER = ("libpython", "python3", "libtorch_python", "libc.so", "libc-", "libm.so", "libstdc++", "libgcc_s",
               "ld-linux", "libpthread", "libgomp", "libiomp", "[vdso]", "[vsyscall]")  # (OpenMP's runtime only
# schedules: the work of a parallel region runs in the code that opened it, the candidate's own or torch's)
_PAGE = mmap.PAGESIZE
_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine)
_libc = ctypes.CDLL(None, use_errno=True)


def _open_event(tid: int, cpu: int, period_ns: int = PERIOD_NS) -> int:
    """A task-clock sampling event on thread `tid` (and the threads it starts) on `cpu`, user space only, enabled;
    its descriptor. (A ring of samples is refused on an inherited event of every CPU: one per CPU, then.)"""
    attr = bytearray(128)  # perf_event_attr: type SOFTWARE, config TASK_CLOCK, sample IP; inherit, exclude kernel, hv
    struct.pack_into("IIQQQQQ", attr, 0, 1, 128, 1, period_ns, 1, 0, (1 << 1) | (1 << 5) | (1 << 6))
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    fd = _libc.syscall(_NR_PERF_EVENT_OPEN, buf, tid, cpu, -1, 8)  # PERF_FLAG_FD_CLOEXEC
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


class SamplerFailed(RuntimeError):
    """The events could not be opened (too many for the limits of this machine): str() says which and what to do."""


def _raise_open_file_limit() -> None:
    """The soft limit on open files up to the hard one: events are threads x CPUs (torch starts a thread a CPU)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _online_cpus() -> list[int]:
    """Every CPU the candidate could run on (it may change its own affinity), e.g. "0-3,6" -> [0, 1, 2, 3, 6]."""
    cpus = []
    for part in Path("/sys/devices/system/cpu/online").read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def unavailable() -> str | None:
    """Why no sampler can run here (None: it can): a kernel or sandbox without perf events for this user."""
    if _NR_PERF_EVENT_OPEN is None:
        return f"perf_event_open: no syscall number for {os.uname().machine}"
    try:
        os.close(_open_event(0, 0))
    except OSError as exc:
        return f"perf_event_open: {exc.strerror} (kernel.perf_event_paranoid "\
               f"{Path('/proc/sys/kernel/perf_event_paranoid').read_text().strip()})"
    return None


class _Event:
    """One thread's event on one CPU, and its ring of samples."""

    def __init__(self, tid: int, cpu: int, period_ns: int):
        self.fd = _open_event(tid, cpu, period_ns)
        try:
            self.ring = mmap.mmap(self.fd, (RING_PAGES + 1) * _PAGE)
        except OSError:
            os.close(self.fd)
            raise

    def drain(self) -> tuple[list[int], int]:
        """The addresses sampled since the last drain, and how many samples the full ring lost meanwhile."""
        size = RING_PAGES * _PAGE
        head, tail = struct.unpack_from("QQ", self.ring, 1024)  # data_head, data_tail
        data = self.ring[_PAGE:_PAGE + size]
        data = data + data  # a record that wraps reads straight on
        ips, lost = [], 0
        while tail < head:
            at = tail % size
            kind, _, length = struct.unpack_from("IHH", data, at)
            if length == 0:
                break
            if kind == 9:  # PERF_RECORD_SAMPLE: the ip
                ips.append(struct.unpack_from("Q", data, at + 8)[0])
            elif kind == 2:  # PERF_RECORD_LOST: id, lost
                lost += struct.unpack_from("Q", data, at + 16)[0]
            tail += length
        struct.pack_into("Q", self.ring, 1032, head)
        return ips, lost

    def close(self) -> None:
        self.ring.close()
        os.close(self.fd)


class CpuSampler:
    """The calls of one callee's worker: `arm` before its first call (stopped), `collect` after each, `close` at
    the end. `own`: the folders of the libraries built for it (none: the baseline callee, watched for its share of
    the cost only)."""

    def __init__(self, pid: int, own: list[Path], period_ns: int = PERIOD_NS):
        self.pid, self.own, self.period_ns = pid, [str(p) for p in own], period_ns
        self.events: list[_Event] = []
        self.counts = {"own": 0, "foreign": 0, "interpreter": 0}
        self.foreign_files: dict[str, int] = {}
        self.calls = 0

    def arm(self) -> None:
        """Events on every thread it has and every CPU (the threads it starts inherit them); once."""
        if self.events:
            return
        _raise_open_file_limit()
        threads, cpus = os.listdir(f"/proc/{self.pid}/task"), _online_cpus()
        try:
            for name in threads:
                for cpu in cpus:
                    self.events.append(_Event(int(name), cpu, self.period_ns))
        except OSError as exc:
            self.close()
            raise SamplerFailed(
                f"the trusted CPU sampler could not open its {len(threads) * len(cpus)} events ({len(threads)} "
                f"threads x {len(cpus)} CPUs: {exc.strerror}); raise the open-file limit (ulimit -n) or "
                "kernel.perf_event_mlock_kb, or judge with --policy kernelbench") from None

    def collect(self) -> None:
        """After a call: its samples placed (the candidate is stopped, its maps as they were in the call)."""
        regions = self._regions()
        starts = [r[0] for r in regions]
        for event in self.events:
            ips, lost = event.drain()
            if lost:  # (the ring held a call's first RING_PAGES of samples: what it could not see is not its own)
                self.counts["foreign"] += lost
                self.foreign_files[LOST] = self.foreign_files.get(LOST, 0) + lost
            for ip in ips:
                i = bisect.bisect_right(starts, ip) - 1
                path = regions[i][2] if i >= 0 and ip < regions[i][1] else "[unmapped]"
                kind = self._kind(path)
                self.counts[kind] += 1
                if kind == "foreign":
                    self.foreign_files[path] = self.foreign_files.get(path, 0) + 1
        self.calls += 1

    def _regions(self) -> list[tuple[int, int, str]]:
        regions = []
        with open(f"/proc/{self.pid}/maps") as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                if "x" in parts[1]:
                    lo, hi = (int(a, 16) for a in parts[0].split("-"))
                    regions.append((lo, hi, parts[5].strip() if len(parts) > 5 else "[anonymous]"))
        return sorted(regions)

    def _kind(self, path: str) -> str:
        if any(path.startswith(own + "/") for own in self.own):
            return "own"
        name = os.path.basename(path)
        if name.startswith(INTERPRETER) or "/lib-dynload/" in path:
            return "interpreter"
        return "foreign"

    def summary(self) -> dict:
        """For the verdict's timing: the samples, their shares, the foreign files most sampled."""
        samples = sum(self.counts.values())
        top = sorted(self.foreign_files.items(), key=lambda item: -item[1])[:3]
        return {"calls": self.calls, "samples": samples, "period_us": self.period_ns / 1e3,
                "shares": {k: round(n / samples, 4) for k, n in self.counts.items()} if samples else {},
                "foreign_files": {os.path.basename(p): n for p, n in top}}

    def violations(self) -> list[str]:
        compiled = self.counts["own"] + self.counts["foreign"]
        if not self.own or compiled < MIN_SAMPLES or self.counts["foreign"] <= FOREIGN_SHARE * compiled or \
                self.counts["foreign"] <= FOREIGN_OF_ALL * sum(self.counts.values()):
            return []
        where = ", ".join(f"{name} {n}" for name, n in self.summary()["foreign_files"].items())
        return [f"torch compute: {self.counts['foreign'] / compiled:.0%} of the calls' CPU time in compiled code, "
                f"sampled from outside the process, ran in code the candidate did not write ({where}; its own "
                f"libraries {self.counts['own']} of {compiled} samples)"]

    def close(self) -> None:
        for event in self.events:
            event.close()
        self.events = []
