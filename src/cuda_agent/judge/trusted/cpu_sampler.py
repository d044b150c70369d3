"""Where the candidate's CPU time goes, seen from outside its process (the cpu backend's trusted path, strict).

The in-process op audit (a profiler in the candidate's own process) says whether `forward` computed with torch's
ops; a candidate that rewrites the harness's report passes it. This sampler is the trusted side's own view: a
`perf_event_open` task-clock event on every thread of the candidate's worker and every CPU, opened by the reference
worker before the first call (the candidate stopped) and kept until its calls end, inherited by every thread it
starts, samples the instruction pointer every period of a thread's CPU time (`PERIOD_NS` unless the judge's
`cpu_sample_period_us` says otherwise: the kernel's interrupt, which nothing in the process can switch off:
`PR_TASK_PERF_EVENTS_DISABLE` only reaches events the caller created). The candidate runs only in its calls (it is
stopped between them), so every call is watched, timed ones too, and the period runs on across calls (short calls
add up). After each call (stopped) its samples are placed by the file their address maps (`/proc/PID/smaps`),
unless an executable mapping was made there during the call (the events record each: what ran at the sample's time
is not known, so it is foreign):

- `own`: the libraries the judge built for it (its build folder, read-only to it), unless their pages were written
  (copy-on-write) or are byte for byte a foreign library's (red team F);
- `foreign`: compute it did not write: torch's and its math libraries, and anything not named below (a copy of
  torch's library under another name, code generated at run time);
- `interpreter`: Python, torch's Python binding and the C/C++ and OpenMP runtimes (calls, allocation, copies of
  arguments, scheduling threads): the very files the trusted side maps (device and inode: a mapping's name is the
  candidate's to choose).

A thread it starts gets its own events, each starting its period afresh: one that runs less than a period on a CPU is
never sampled there. The CPU time no sample saw counts as foreign, a sample a period: of each ended thread, what its
samples do not cover (its count comes back in the ring as it ends: inherit_stat), and all the time of each live thread
that has no sample (schedstat). A kernel of its own that starts threads per call pays for them; torch's pool and
parallel_for's threads live on and are sampled. (Left: a live thread's time beyond its samples once it has one, its
kernel time not told apart from it: a thread that runs just under a period on each CPU, one sample's worth more,
and parks hides up to CPUs x period, thousands of threads for a task's compute, within the sandbox's thread count.)

Sampling slows what it watches (each interrupt costs ~20 us of a thread's time in this VM, so 50 us cost 40%;
`benchmarks/cpu_sampler_overhead.py`), so the period is long and the baseline callee is watched the same way beside
the candidate (its samples judge nothing): both pay the same share. Watching only some calls, as before, let a
candidate tell them while they ran (red team E: the interrupts as gaps in a spin) and use torch in the others.

The rule (strict): more than `FOREIGN_SHARE` of the compiled-code samples (own or foreign: the runtimes aside)
foreign, and more than `FOREIGN_OF_ALL` of all samples, is torch compute. The allowed ops (allocation, views, fills,
copies) do not come near it in a candidate that computes its outputs itself (an honest kernel of the tests: 15%;
torch's ops in `forward`: 100%). A candidate that pads its share to pass must do it on torch's own thread, after or
before torch's work, for at least a quarter of its time (own samples of other threads taken beside a thread in
foreign code count for nothing: red team F); what torch's kernels could win it is bounded by that.
"""

from __future__ import annotations

import bisect
import hashlib
import ctypes
import mmap
import os
import resource
import struct
import sysconfig
from pathlib import Path

PERIOD_NS = 1_000_000  # a sample per ms of a thread's CPU time (every call is watched, timed ones too)
FOREIGN_SHARE = 0.8  # the share of the calls' compiled-code samples in foreign code beyond which it is torch compute
FOREIGN_OF_ALL = 0.5  # ... and of all its samples: a candidate whose only compiled code is allowed ops (allocation,
# fills: a constant output) spends its calls in the interpreter, where torch's compute in `forward` spends them in
# torch (77% of all samples in the tests' attack)
BESIDE_NS = 5_000_000  # a sample outside foreign code within this of a foreign sample of another thread ran beside
# torch's compute: it dilutes nothing (held out, red team F: a thread of its own spinning on a spare core while torch
# computed on the other made 63% of the samples own, for nothing on the clock; a pad that runs alone costs its time)
RUN_GAP_NS = 20_000_000  # consecutive foreign samples of a thread further apart than this are two runs
MIN_SAMPLES = 20  # fewer compiled-code samples decide nothing (an honest kernel at 40% foreign passes 20 samples
# past 80% with probability 1e-4; the tests' at 15%, never)
MIN_FOREIGN = 10  # ... and fewer foreign ones (under 10 ms of torch in all the calls): a main thread that only
# allocates while threads of its own compute is mostly foreign, and would make all their samples beside it
RING_PAGES = 16  # each thread's ring of samples (read after every call: 2,048 samples of 32 bytes, 2 s of a
# thread's CPU time on one CPU in one call; samples it loses beyond that count as foreign)
LOST = "[lost: the ring was full]"
UNSEEN = "[unseen: CPU time no sample saw]"
INTERPRETER = ("libpython", "python3", "libtorch_python", "libc.so", "libc-", "libm.so", "libstdc++", "libgcc_s",
               "ld-linux", "libpthread", "libgomp", "libiomp", "[vdso]", "[vsyscall]")  # (OpenMP's runtime only
# schedules: the work of a parallel region runs in the code that opened it, the candidate's own or torch's)
_SPECIAL = ("[vdso]", "[vsyscall]")  # the kernel's own (no file; no name the candidate can give a mapping)
_PAGE = mmap.PAGESIZE
_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine)
_libc = ctypes.CDLL(None, use_errno=True)


def _open_event(tid: int, cpu: int, period_ns: int = PERIOD_NS) -> int:
    """A task-clock sampling event on thread `tid` (and the threads it starts) on `cpu`, user space only, enabled;
    its descriptor. (A ring of samples is refused on an inherited event of every CPU: one per CPU, then.)"""
    attr = bytearray(128)  # perf_event_attr: type SOFTWARE, config TASK_CLOCK, sample IP, TID, TIME; inherit,
    # exclude kernel, hv; mmap: a record of every executable mapping the thread makes (mmap, mprotect); inherit_stat:
    # a record of each inherited thread's count as it ends
    struct.pack_into("IIQQQQQ", attr, 0, 1, 128, 1, period_ns, 1 | 2 | 4, 0,
                     (1 << 1) | (1 << 5) | (1 << 6) | (1 << 8) | (1 << 11))
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    fd = _libc.syscall(_NR_PERF_EVENT_OPEN, buf, tid, cpu, -1, 8)  # PERF_FLAG_FD_CLOEXEC
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


_RUNTIME: set[str] = set()
_FILE_PAGES: dict[str, set[bytes]] = {}  # "major:minor inode" of a foreign file -> its pages' digests
WRITTEN = "written"  # a file's executable mapping some of whose pages were written (copy-on-write)
REMAPPED = "remapped"  # an address where an executable mapping was made during the call


def _merged(spans: list[tuple[int, int, str]]) -> list[tuple[int, int]]:
    """Address ranges, sorted and merged (a candidate may map a great many: each sample looks them up by bisection)."""
    merged: list[list[int]] = []
    for lo, hi, _ in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _within(ranges: list[tuple[int, int]], address: int) -> bool:
    i = bisect.bisect_right(ranges, (address, float("inf"))) - 1
    return i >= 0 and address < ranges[i][1]


def _runtime_files() -> set[str]:
    """"major:minor inode" of the interpreter's and runtimes' files as this (trusted) process maps them, and of its
    Python's extension modules (`lib-dynload`): the same files, bound read-only, in the candidate's sandbox."""
    if not _RUNTIME:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                if len(parts) > 5 and "x" in parts[1] and os.path.basename(parts[5].strip()).startswith(INTERPRETER):
                    _RUNTIME.add(f"{parts[3]} {parts[4]}")
        dynload = Path(sysconfig.get_path("platstdlib")) / "lib-dynload"
        for path in dynload.glob("*.so") if dynload.is_dir() else []:
            st = path.stat()
            _RUNTIME.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino}")
    return _RUNTIME


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
        self.fd, self.period_ns = _open_event(tid, cpu, period_ns), period_ns
        self.sampled: dict[int, int] = {}  # samples of each thread so far (its count is matched when it ends)
        try:
            self.ring = mmap.mmap(self.fd, (RING_PAGES + 1) * _PAGE)
        except OSError:
            os.close(self.fd)
            raise

    def drain(self) -> tuple[list[tuple[int, int, int]], int, list[tuple[int, int, str]], int]:
        """The samples since the last drain, (address, thread, time), how many samples the full ring lost
        meanwhile, the executable mappings made meanwhile, (start, end, file), and the CPU time (ns) of the threads
        that ended meanwhile that no sample saw (a thread's event starts its period afresh: one that ends within a
        period of its CPU time is never sampled; held out, forty-fourth session: torch's op in 64 threads of 0.1 ms
        a call)."""
        size = RING_PAGES * _PAGE
        head, tail = struct.unpack_from("QQ", self.ring, 1024)  # data_head, data_tail
        data = self.ring[_PAGE:_PAGE + size]
        data = data + data  # a record that wraps reads straight on
        ips, lost, mapped, unseen = [], 0, [], 0
        while tail < head:
            at = tail % size
            kind, _, length = struct.unpack_from("IHH", data, at)
            if length == 0:
                break
            if kind == 9:  # PERF_RECORD_SAMPLE: the ip, pid and tid, time
                ip, _, tid, when = struct.unpack_from("QIIQ", data, at + 8)
                ips.append((ip, tid, when))
                self.sampled[tid] = self.sampled.get(tid, 0) + 1
            elif kind == 8:  # PERF_RECORD_READ: pid, tid, its count as it ended (its time in the kernel too)
                _, tid, count = struct.unpack_from("IIQ", data, at + 8)
                unseen += max(0, count - self.sampled.pop(tid, 0) * self.period_ns)
            elif kind == 2:  # PERF_RECORD_LOST: id, lost
                lost += struct.unpack_from("Q", data, at + 16)[0]
            elif kind == 1:  # PERF_RECORD_MMAP: pid, tid, address, length, file offset, file name
                start, extent = struct.unpack_from("QQ", data, at + 16)
                name = bytes(data[at + 40:at + length]).split(b"\0", 1)[0].decode(errors="replace")
                mapped.append((start, start + extent, name))
            tail += length
        struct.pack_into("Q", self.ring, 1032, head)
        return ips, lost, mapped, unseen

    def close(self) -> None:
        self.ring.close()
        os.close(self.fd)


def _foreign_spans(placed: list[tuple[str, int, int]]) -> list[tuple[int, int, int]]:
    """(start, end, thread) of each run of a thread's consecutive foreign samples (none of its other samples
    between, each within `RUN_GAP_NS` of the last: the thread was in foreign code, or in the kernel, which is not
    sampled, all along), widened by `BESIDE_NS` each side."""
    spans = []
    by_thread: dict[int, list[tuple[int, str]]] = {}
    for kind, tid, when in placed:
        by_thread.setdefault(tid, []).append((when, kind))
    for tid, samples in by_thread.items():
        run = None
        for when, kind in sorted(samples):
            if kind == "foreign" and run is not None and when - run[1] <= RUN_GAP_NS:
                run[1] = when
                continue
            if run is not None:
                spans.append((run[0] - BESIDE_NS, run[1] + BESIDE_NS, tid))
            run = [when, when] if kind == "foreign" else None
        if run is not None:
            spans.append((run[0] - BESIDE_NS, run[1] + BESIDE_NS, tid))
    return spans


class CpuSampler:
    """The calls of one callee's worker: `arm` before its first call (stopped), `collect` after each, `close` at
    the end. `own`: the folders of the libraries built for it (none: the baseline callee, watched for its share of
    the cost only)."""

    def __init__(self, pid: int, own: list[Path], period_ns: int = PERIOD_NS):
        self.pid, self.own, self.period_ns = pid, [str(p) for p in own], period_ns
        self.events: list[_Event] = []
        self.counts = {"own": 0, "foreign": 0, "interpreter": 0}
        self._pages: dict[tuple[str, int], bool] = {}  # own pages found copies of foreign ones
        self._foreign_pages: set[bytes] = set()
        self._foreign_pages_read, self._files_hashed = False, set()
        self.beside = {"own": 0, "interpreter": 0}  # of those, samples taken beside foreign code on another thread
        self.foreign_files: dict[str, int] = {}
        self.calls = 0
        self.mapped_in_calls = 0  # executable mappings it made during its calls
        self.ended_unseen_ns = 0  # CPU time of the threads that ended that no sample saw
        self.live_unseen_ns = 0  # ... and of the threads alive at the last call's end that have no sample
        self.thread_samples: dict[int, int] = {}  # samples of each thread, every call
        self.balance: dict[int, int] = {}  # foreign less own samples of each live thread, every call
        self.cpu_at_arm: dict[int, int] = {}  # each thread's CPU time (ns) when the events were opened

    def arm(self) -> None:
        """Events on every thread it has and every CPU (the threads it starts inherit them); once."""
        if self.events:
            return
        _raise_open_file_limit()
        threads, cpus = os.listdir(f"/proc/{self.pid}/task"), _online_cpus()
        self.cpu_at_arm = self._thread_cpu()
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
        """After a call: its samples placed (the candidate is stopped, its maps as they were at the call's end;
        where an executable mapping was made during the call, what they were at a sample's time is not known)."""
        regions = self._regions()
        starts = [r[0] for r in regions]
        drained = [event.drain() for event in self.events]
        remapped = _merged([span for _, _, mapped, _ in drained for span in mapped])
        self.mapped_in_calls += sum(len(mapped) for _, _, mapped, _ in drained)
        self.ended_unseen_ns += sum(unseen for *_, unseen in drained)
        placed = []
        for ips, lost, _, _ in drained:
            if lost:  # (the ring held a call's first RING_PAGES of samples: what it could not see is not its own)
                self.counts["foreign"] += lost
                self.foreign_files[LOST] = self.foreign_files.get(LOST, 0) + lost
            for ip, tid, when in ips:
                i = bisect.bisect_right(starts, ip) - 1
                path, file_id, offset = regions[i][2:] if i >= 0 and ip < regions[i][1] else ("[unmapped]", "", 0)
                if _within(remapped, ip):  # (held out: torch's text mapped over by its own file as each reply left)
                    file_id, path = REMAPPED, f"{path} (mapped during the call)"
                kind = self._kind(path, file_id)
                if kind == "own" and self._copied(path, offset + (ip - regions[i][0]) // _PAGE * _PAGE, regions):
                    kind, file_id, path = "foreign", WRITTEN, f"{path} (a copy of foreign code)"
                self.counts[kind] += 1
                self.thread_samples[tid] = self.thread_samples.get(tid, 0) + 1
                placed.append((kind, tid, when))
                if kind == "foreign":
                    path = f"{path} (its pages written)" if file_id == WRITTEN and "(" not in path else path
                    self.foreign_files[path] = self.foreign_files.get(path, 0) + 1
        spans = _foreign_spans(placed)
        balance: dict[int, int] = {}  # foreign samples less own ones, by thread (the interpreter's count for neither:
        for kind, tid, _ in placed:  # under load a torch thread's Python outweighed its few torch samples in a call)
            if kind != "interpreter":
                balance[tid] = balance.get(tid, 0) + (1 if kind == "foreign" else -1)
        # a thread mostly in foreign code in this call was torch's along it (its time in the kernel, not sampled,
        # too): what the other threads ran in the call ran beside it. So was one mostly foreign over all its calls
        # so far, for the threads that are not (under load a call may see none of torch's ~1 ms on it: stop 62's CI;
        # threads that each fill with torch, then compute, are mostly foreign alike and ran their phases together:
        # stop 63's CI). (Left: torch on one thread, padded on that same thread by a quarter of its time.)
        live = self._thread_cpu()
        for tid, n in balance.items():
            self.balance[tid] = self.balance.get(tid, 0) + n
        self.balance = {tid: n for tid, n in self.balance.items() if tid in live}  # (ended: no one's)
        in_call = {tid for tid, n in balance.items() if n > 0}
        so_far = {tid for tid, n in self.balance.items() if n > 0}
        for kind, tid, when in placed:  # what ran beside torch's compute, on another thread, hides none of it
            if kind != "foreign" and (in_call - {tid} or (so_far and tid not in so_far) or
                                      any(lo <= when <= hi and other != tid for lo, hi, other in spans)):
                self.beside[kind] += 1
        self.live_unseen_ns = sum(max(0, ns - self.cpu_at_arm.get(tid, 0)) for tid, ns in live.items()
                                  if tid not in self.thread_samples)
        self.calls += 1

    def _thread_cpu(self) -> dict[int, int]:
        """Each live thread's CPU time so far (ns, the kernel's schedstat: user and kernel time)."""
        times: dict[int, int] = {}
        try:
            names = os.listdir(f"/proc/{self.pid}/task")
        except OSError:  # (it has ended)
            return times
        for name in names:
            try:
                times[int(name)] = int(Path(f"/proc/{self.pid}/task/{name}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):  # (ended meanwhile: its count comes back in the ring)
                pass
        return times

    @property
    def unseen(self) -> int:
        """The CPU time of its threads that no sample saw, in samples (a period each): of an ended thread, what its
        samples do not cover (its count comes back in the ring); of a live one, all of it where it has no sample
        (a sampled live thread's time in the kernel, its outputs' page faults, cannot be told from the part of a
        period it has run towards its next sample: it counts for nothing)."""
        return (self.ended_unseen_ns + self.live_unseen_ns) // self.period_ns

    def _regions(self) -> list[tuple[int, int, str, str, int]]:
        """The executable mappings: (start, end, path, "major:minor inode", file offset), the "major:minor inode"
        WRITTEN where it is writable too, or where any of its pages
        is no longer the file's (copy-on-write: smaps' Anonymous): its code is not that file's, whatever its path
        (held out, red team F: torch's text overwritten, in place, by private writable mappings of the judge-built
        library's file holding torch's bytes: 72% "own")."""
        regions, current = [], None
        with open(f"/proc/{self.pid}/smaps") as smaps:
            for line in smaps:
                parts = line.split(maxsplit=5)
                if len(parts) >= 5 and "-" in parts[0] and len(parts[1]) == 4 and ":" not in parts[0]:
                    current = None
                    if "x" in parts[1]:
                        lo, hi = (int(a, 16) for a in parts[0].split("-"))
                        current = [lo, hi, parts[5].strip() if len(parts) > 5 else "[anonymous]",
                                   f"{parts[3]} {parts[4]}" if "w" not in parts[1] else WRITTEN, int(parts[2], 16)]
                        regions.append(current)  # (writable too: its pages may have been anything in the call,
                        # and given back to the file's since, madvise(MADV_DONTNEED), with no Anonymous left)
                elif current is not None and parts[0] == "Anonymous:" and int(parts[1]) > 0 and current[3] != "00:00 0":
                    current[3] = WRITTEN
        return sorted(tuple(r) for r in regions)

    def _kind(self, path: str, file_id: str | None = None) -> str:
        if file_id in (WRITTEN, REMAPPED):  # (its code is not its file's, or not known to have been)
            return "foreign"
        if any(path.startswith(own + "/") for own in self.own):
            return "own"
        if path in _SPECIAL:
            return "interpreter"
        name = os.path.basename(path)
        if (name.startswith(INTERPRETER) or "/lib-dynload/" in path) and self._installed(path, file_id):
            return "interpreter"
        return "foreign"

    def _installed(self, path: str, file_id: str | None) -> bool:
        """Whether the file the candidate maps is one of the runtime's files as the trusted side itself maps them
        (device and inode): a name is the candidate's to choose (held out, red team F: torch's code copied into a
        memfd named `x/libc.so.6` and mapped over its own text, /memfd:x/libc.so.6 (deleted), read as the C runtime;
        as would an anonymous mapping named the same way, or a file of that name in a folder it writes). (None: not
        known, the tests' names.)"""
        return file_id is None or file_id in _runtime_files()

    def _copied(self, path: str, offset: int, regions) -> bool:
        """Whether the page of an own library's file at `offset` is, byte for byte, a page of a foreign library the
        candidate maps (held out, red team F: torch's hot text pages `.incbin`-ed into its own library, whose file
        was then mapped, unwritten, over torch's text at their places: 78% "own" under the checks above). Pages of
        one repeated byte (padding) aside."""
        key = (path, offset)
        if key not in self._pages:
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    page = f.read(_PAGE)
            except OSError:
                page = b""
            if not self._foreign_pages_read:
                self._read_foreign_pages(regions)
            self._pages[key] = len(page) == _PAGE and page.count(page[:1]) != _PAGE and \
                hashlib.blake2b(page, digest_size=16).digest() in self._foreign_pages
        return self._pages[key]

    def _read_foreign_pages(self, regions) -> None:
        """Digests of every page-aligned page of the foreign files the candidate maps executable (once: cached by
        file for the process)."""
        self._foreign_pages_read = True
        for _, _, path, file_id, _ in regions:
            if file_id in ("", WRITTEN, "00:00 0") or self._kind(path, file_id) != "foreign" or \
                    path in self._files_hashed:
                continue
            self._files_hashed.add(path)
            if file_id not in _FILE_PAGES:
                digests = set()
                try:
                    with open(path, "rb") as f:
                        st = os.fstat(f.fileno())
                        if f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino}" == file_id:
                            while page := f.read(_PAGE):
                                digests.add(hashlib.blake2b(page, digest_size=16).digest())
                except OSError:
                    pass
                _FILE_PAGES[file_id] = digests
            self._foreign_pages |= _FILE_PAGES[file_id]

    def _judged(self) -> tuple[dict[str, int], dict[str, int]]:
        """The counts the rule reads, the unseen time's samples foreign, and the foreign files with it."""
        counts, files = dict(self.counts), dict(self.foreign_files)
        if self.unseen:
            counts["foreign"] += self.unseen
            files[UNSEEN] = self.unseen
        return counts, files

    def summary(self) -> dict:
        """For the verdict's timing: the samples (the unseen time's among them, foreign), their shares, the foreign
        files most sampled."""
        counts, files = self._judged()
        samples = sum(counts.values())
        top = sorted(files.items(), key=lambda item: -item[1])[:3]
        return {"calls": self.calls, "samples": samples, "unseen": self.unseen, "period_us": self.period_ns / 1e3,
                "mapped_in_calls": self.mapped_in_calls,
                "shares": {k: round(n / samples, 4) for k, n in counts.items()} if samples else {},
                "beside_foreign": dict(self.beside),
                "foreign_files": {os.path.basename(p): n for p, n in top}}

    def violations(self) -> list[str]:
        counts, _ = self._judged()
        foreign = counts["foreign"]
        own, interpreter = (counts[k] - self.beside[k] for k in ("own", "interpreter"))
        if not self.own or foreign + counts["own"] < MIN_SAMPLES or foreign < MIN_FOREIGN \
                or foreign <= FOREIGN_SHARE * (own + foreign) \
                or foreign <= FOREIGN_OF_ALL * (own + foreign + interpreter):
            return []
        where = ", ".join(f"{name} {n}" for name, n in self.summary()["foreign_files"].items())
        beside = f" ({self.beside['own']} more beside it on other threads)" if self.beside["own"] else ""
        return [f"torch compute: {foreign / (own + foreign):.0%} of the calls' CPU time in compiled code, sampled "
                f"from outside the process, ran in code the candidate did not write ({where}; its own libraries "
                f"{own} of {own + foreign} samples{beside})"]

    def close(self) -> None:
        for event in self.events:
            event.close()
        self.events = []
