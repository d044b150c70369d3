"""Where the candidate's CPU time goes, seen from outside its process (the cpu backend's trusted path, strict).

The in-process op audit (a profiler in the candidate's own process) says whether `forward` computed with torch's
ops; a candidate that rewrites the harness's report passes it. This sampler is the trusted side's own view: for a
sampled call, a `perf_event_open` task-clock event on every thread of the candidate's worker and every CPU, opened by
the reference worker while the candidate is stopped and inherited by every thread it starts in the call, samples the
instruction pointer every `PERIOD_NS` of a thread's CPU time (the kernel's interrupt, which nothing in the process
can switch off: `PR_TASK_PERF_EVENTS_DISABLE` only reaches events the caller created). After the call (stopped) each
sample is placed by the file its address maps (`/proc/PID/maps`):

- `own`: the libraries the judge built for it (its build folder, read-only to it);
- `foreign`: compute it did not write: torch's and its math libraries, and anything not named below (a copy of
  torch's library under another name, code generated at run time);
- `interpreter`: Python, torch's Python binding and the C/C++ and OpenMP runtimes (calls, allocation, copies of
  arguments, scheduling threads).

Sampling slows the calls it watches (events on a thread cost at every context switch: 15-40% on a busy 2-core
machine), so no timed call is sampled: the verification calls are, and `SAMPLED_CALLS` extra calls put among the
timed ones at places drawn by the trusted side (their outputs compared, their windows not timed). Open (red team E,
2026-12-06): a candidate can tell a sampled call while it runs (the interrupts show as gaps in a spin) and compute
with torch only in the others; sampling every call, the baselines' too, would leave nothing to tell apart.

The rule (strict): more than `FOREIGN_SHARE` of the sampled compiled-code samples (own or foreign: the runtimes
aside) foreign, and more than `FOREIGN_OF_ALL` of all samples, is torch compute. The allowed ops (allocation,
views, fills, copies) do not come near it in a candidate that computes its outputs itself (an honest kernel of the
tests: 15%; torch's ops in `forward`: 100%), and a candidate that pads its share to pass spends at least as much
time again as the torch compute it hides: what torch's kernels could win it is bounded by that.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import struct
from pathlib import Path

PERIOD_NS = 50_000  # a sample per 50 us of a thread's CPU time (sampled calls are never timed)
SAMPLED_CALLS = 12  # extra sampled calls among the timed ones
FOREIGN_SHARE = 0.8  # the share of the calls' compiled-code samples in foreign code beyond which it is torch compute
FOREIGN_OF_ALL = 0.5  # ... and of all its samples: a candidate whose only compiled code is allowed ops (allocation,
# fills: a constant output) spends its calls in the interpreter, where torch's compute in `forward` spends them in
# torch (77% of all samples in the tests' attack)
MIN_SAMPLES = 20  # fewer compiled-code samples decide nothing (an honest kernel at 40% foreign passes 20 samples
# past 80% with probability 1e-4; the tests' at 15%, never)
RING_PAGES = 16  # each thread's ring of samples (read after every call: 4,096 samples of 16 bytes)
INTERPRETER = ("libpython", "python3", "libtorch_python", "libc.so", "libc-", "libm.so", "libstdc++", "libgcc_s",
               "ld-linux", "libpthread", "libgomp", "libiomp", "[vdso]", "[vsyscall]")  # (OpenMP's runtime only
# schedules: the work of a parallel region runs in the code that opened it, the candidate's own or torch's)
_PAGE = mmap.PAGESIZE
_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine)
_libc = ctypes.CDLL(None, use_errno=True)


def _open_event(tid: int, cpu: int) -> int:
    """A task-clock sampling event on thread `tid` (and the threads it starts) on `cpu`, user space only, enabled;
    its descriptor. (A ring of samples is refused on an inherited event of every CPU: one per CPU, then.)"""
    attr = bytearray(128)  # perf_event_attr: type SOFTWARE, config TASK_CLOCK, sample IP; inherit, exclude kernel, hv
    struct.pack_into("IIQQQQQ", attr, 0, 1, 128, 1, PERIOD_NS, 1, 0, (1 << 1) | (1 << 5) | (1 << 6))
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    fd = _libc.syscall(_NR_PERF_EVENT_OPEN, buf, tid, cpu, -1, 8)  # PERF_FLAG_FD_CLOEXEC
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


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

    def __init__(self, tid: int, cpu: int):
        self.fd = _open_event(tid, cpu)
        try:
            self.ring = mmap.mmap(self.fd, (RING_PAGES + 1) * _PAGE)
        except OSError:
            os.close(self.fd)
            raise

    def drain(self) -> list[int]:
        """The addresses sampled since the last drain."""
        size = RING_PAGES * _PAGE
        head, tail = struct.unpack_from("QQ", self.ring, 1024)  # data_head, data_tail
        data = self.ring[_PAGE:_PAGE + size]
        data = data + data  # a record that wraps reads straight on
        ips = []
        while tail < head:
            at = tail % size
            kind, _, length = struct.unpack_from("IHH", data, at)
            if length == 0:
                break
            if kind == 9:  # PERF_RECORD_SAMPLE: the ip
                ips.append(struct.unpack_from("Q", data, at + 8)[0])
            tail += length
        struct.pack_into("Q", self.ring, 1032, head)
        return ips

    def close(self) -> None:
        self.ring.close()
        os.close(self.fd)


class CpuSampler:
    """The sampled calls of one candidate worker: `arm` before such a call (stopped), `collect` after it."""

    def __init__(self, pid: int, own: list[Path]):
        self.pid, self.own = pid, [str(p) for p in own]
        self.events: list[_Event] = []
        self.counts = {"own": 0, "foreign": 0, "interpreter": 0}
        self.foreign_files: dict[str, int] = {}
        self.calls = 0

    def arm(self) -> None:
        """Events on every thread it has and every CPU (the threads it starts in the call inherit them)."""
        try:
            for name in os.listdir(f"/proc/{self.pid}/task"):
                for cpu in _online_cpus():
                    self.events.append(_Event(int(name), cpu))
        except OSError:
            self.close()
            raise

    def collect(self) -> None:
        """After the call: its samples placed (the candidate is stopped, its maps as they were in the call), its
        events closed."""
        try:
            regions = self._regions()
            starts = [r[0] for r in regions]
            for event in self.events:
                for ip in event.drain():
                    i = bisect.bisect_right(starts, ip) - 1
                    path = regions[i][2] if i >= 0 and ip < regions[i][1] else "[unmapped]"
                    kind = self._kind(path)
                    self.counts[kind] += 1
                    if kind == "foreign":
                        self.foreign_files[path] = self.foreign_files.get(path, 0) + 1
            self.calls += 1
        finally:
            self.close()

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
        return {"calls": self.calls, "samples": samples, "period_us": PERIOD_NS / 1e3,
                "shares": {k: round(n / samples, 4) for k, n in self.counts.items()} if samples else {},
                "foreign_files": {os.path.basename(p): n for p, n in top}}

    def violations(self) -> list[str]:
        compiled = self.counts["own"] + self.counts["foreign"]
        if compiled < MIN_SAMPLES or self.counts["foreign"] <= FOREIGN_SHARE * compiled or \
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
