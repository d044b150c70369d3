"""Calls driven and measured by the trusted side (the reference worker): the only clock the verdict believes, for
the candidate's verification and timing and for the baselines alike.

One call: the callee's processes (the candidate's worker, or the baseline callee that runs eager and torch.compile)
are stopped (`freezer.py`); its inputs, drawn here, are written into the buffer it maps (`input_buffers.py`); the
clock starts, the processes resume and the call is sent; when `done` comes back they are stopped again and the
clock stops. The window holds every instruction the callee ran for this call, on every thread, and the handshake
besides, the same for candidate and baselines. Its CPU time is read from the kernel at both ends. While it is
stopped its outputs are read from its memory (`readback.py`) and its inputs compared with what was written;
nothing it does afterwards changes what was read.
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...sandbox.cgroup import members
from ..wire.call_protocol import (
    HELD_CALLS,
    Call,
    Done,
    End,
    Ended,
    Failed,
    Inputs,
    Prepare,
    Prepared,
    ProtocolError,
    receive,
    send,
)
from ..wire.input_buffers import NAME, InputBuffer, layout_of
from ..wire.process import close_fds
from .compare import Leaf
from .cpu_sampler import CpuSampler, SamplerFailed, unavailable
from .freezer import CandidateGone, Freezer, thread_states
from .readback import aliased_pages, mapped_files, process_reader, read_outputs, read_scattered, tensor_spans

OUTSIDE_LIMIT_NS = 1_000_000  # CPU time a stopped callee may show between calls, all calls together (it shows 0)
PROBES = 64  # places of each output read after its call, and again after each of the next HELD_CALLS calls


class CallFailed(RuntimeError):
    """The callee failed in a call; str() says why, `how` is one of: failed (it raised, or answered out of turn),
    ended (its process ended), timeout."""

    def __init__(self, reason: str, how: str = "failed"):
        super().__init__(reason)
        self.how = how


@dataclass
class CallRecord:
    """One call as the trusted side saw it."""
    k: int
    window_us: float  # the trusted clock, from resuming the candidate to stopping it
    cpu_us: float  # its processes' CPU time over that window (the kernel's clocks)
    outputs: list[dict[str, Any]] = field(default_factory=list)  # where it says its outputs are
    raw_us: float = 0.0  # on the GPU: the window as measured, its constant part included
    host_us: float = 0.0  # on the GPU: from sending `call` to its answer (the host's part of the call)
    rewritten: str | None = None  # (cpu) an output of a call before, still held by the caller, changed in this one
    aliased: str | None = None  # (cpu) its outputs' memory maps one page at two addresses


class Calls:
    """The calls of one callee process: `load` inputs, `call`, then `outputs` and `changed_inputs` while stopped."""

    def __init__(self, sock: socket.socket, pids: list[int], worker_pid: int, read_limit: int,
                 cgroup: str | None = None, others: list[int] = ()):
        """`pids`: the callee's processes, stopped between calls. `cgroup`: its sandbox's cgroup folder, whose
        processes (subgroups included) are read after every call: one that is neither one of `pids` nor of
        `others` (the sandbox's own launchers) was started by the candidate and fails the call."""
        self.sock, self.worker_pid, self.read_limit = sock, worker_pid, read_limit
        self.cgroup, self.known = cgroup, {*pids, *others}
        self.freezer = Freezer(pids)
        self.freezer.stop()
        self.buffers: dict[str, tuple[int, InputBuffer]] = {}
        self.calls = 0
        self.current: InputBuffer | None = None
        self.stopped_cpu: dict[int, int] | None = None  # each process's CPU clock at its last stop (None: ran since)
        self.stopped_switches: int | None = None  # and how often its threads had been given a CPU (freezer.switches)
        self.outside: dict[int, int] = {}  # CPU time each process took while stopped, summed: zero unless resumed
        self.outside_gaps = 0  # the gaps between calls in which any of it was taken
        self.late_ns = 0  # CPU time booked after its stop was read with no thread given a CPU since: the call's own
        # (cpu) bytes of the outputs of the last HELD_CALLS calls, at places drawn here: read again after each call
        self.probes: deque[tuple[int, list[tuple[str, int, int]], bytes]] = deque(maxlen=HELD_CALLS)
        self.sampler: CpuSampler | None = None
        self.sampler_unavailable: str | None = None

    def sample(self, own: Path | None, period_ns: int) -> None:
        """(strict, cpu) Sample where every call spends its CPU time, a sample per `period_ns` of a thread's, `own`
        holding the libraries built for it (`cpu_sampler.py`; None: the baseline callee, sampled to pay what the
        candidate pays); where the kernel allows no perf events, the verdict's timing says why."""
        self.sampler_unavailable = unavailable()
        if self.sampler_unavailable is None:
            self.sampler = CpuSampler(self.worker_pid, [own] if own is not None else [], period_ns)

    def sampled(self) -> dict:
        """What the sampler saw (or why there was none); {} where none was asked for."""
        if self.sampler_unavailable:
            return {"unavailable": self.sampler_unavailable}
        return self.sampler.summary() if self.sampler else {}

    def load(self, inputs: list) -> InputBuffer:
        """Write a call's inputs into the buffer of their layout (new layouts are sent to the candidate first)."""
        self._select(inputs).write(inputs)
        return self.current

    def _select(self, inputs: list) -> InputBuffer:
        """The buffer of the inputs' layout made current (a new layout is sent to the callee first)."""
        layout = layout_of(inputs)
        key = json.dumps(layout)
        if key not in self.buffers:
            buffer = InputBuffer(layout)
            self.buffers[key] = (len(self.buffers), buffer)
            send(self.sock, Inputs(self.buffers[key][0], layout), [buffer.fd])
        self.current = self.buffers[key][1]
        return self.current

    def call(self, deadline: float, fn: str = "", flush=None) -> CallRecord:
        """One call (of `fn`, where the callee serves several) on the inputs loaded last, after `flush()` (the
        caches), watched by the sampler where there is one; CallFailed when the callee does not answer `done` in
        time."""
        assert self.current is not None, "load inputs first"
        if flush is not None:
            flush()
        ident = next(i for i, b in self.buffers.values() if b is self.current)
        k, self.calls = self.calls, self.calls + 1
        cpu0 = self._cpu_before(k)
        if self.sampler is not None:
            try:
                self.sampler.arm()
            except SamplerFailed as exc:  # (what cannot be watched is not judged under strict)
                raise CallFailed(str(exc)) from None
        t0 = time.perf_counter_ns()
        self._resume(f"call {k}")
        try:
            reply, fds = self._ask(k, Call(k, ident, fn), deadline - time.monotonic(),
                                   f"call {k} did not return in time")
            close_fds(fds)  # (none belong to an answer here: kept, a candidate's would pile up in this process)
        finally:
            try:
                self.freezer.signal_stop()
            except CandidateGone:
                pass
        try:
            self.freezer.wait_stopped()  # (the call ends there: held out, red team 2026-12-05: a copy in the kernel
            t1 = time.perf_counter_ns()  # after the stop was sent, outside the clock, its result read: reward 1 -> 3)
            self.freezer.settle()
            cpu1 = self._mark_stopped()
            if self.sampler is not None:
                self.sampler.collect()
        except (CandidateGone, FileNotFoundError, ProcessLookupError) as exc:
            raise CallFailed(f"the process ended during call {k} ({exc})", "ended") from None
        reply = self._checked_reply(k, reply)
        spans = tensor_spans(reply.outputs)
        record = CallRecord(k, (t1 - t0) / 1e3, (cpu1 - cpu0) / 1e3, reply.outputs)
        if fn:  # (another function: the baselines', or the candidate's weights reloaded, which change its buffers)
            self.probes.clear()
            return record
        record.rewritten = self._rewritten(k)
        record.aliased = aliased_pages(self.worker_pid, [(a, b) for _, a, b in spans]) if spans else None
        self._probe(k, spans)
        return record

    def _rewritten(self, k: int) -> str | None:
        """Which output of the last `HELD_CALLS` calls changed during call `k` (None: none). The candidate's process
        keeps their outputs alive (`callee.py`), as a caller that kept them would: one that changed was written
        again by the candidate, in memory it had returned (an output that is gone reads as changed). Checked at
        `PROBES` places of each output drawn here after it returned, every call, read or not."""
        for call, places, before in self.probes:
            if not places:
                continue
            now = read_scattered(self.worker_pid, [(a, n) for _, a, n in places])
            if now is None:
                return f"{places[0][0]} of call {call} (no longer readable)"
            at = 0
            for path, _, n in places:
                if now[at:at + n] != before[at:at + n]:
                    return f"{path} of call {call}"
                at += n
        return None

    def _probe(self, k: int, spans: list[tuple[str, int, int]]) -> None:
        """Read call `k`'s outputs at `PROBES` places of each, drawn now, up to 8 bytes wide (an entry for every
        call, empty where there is nothing to read: the window stays that of the outputs the callee holds)."""
        places = []
        for path, lo, hi in spans:
            width = min(8, hi - lo)
            places += [(path, lo + secrets.randbelow(max(1, hi - lo - width + 1)), width) for _ in range(PROBES)]
        found = read_scattered(self.worker_pid, [(a, n) for _, a, n in places]) if places else None
        self.probes.append((k, places, found) if found is not None else (k, [], b""))

    def must_check(self, call: CallRecord) -> bool:
        """Whether this call's outputs must be compared whether or not it was picked (see `GpuCalls`)."""
        return False

    def _ask(self, k: int, message, timeout_s: float, late: str) -> tuple[Any, list[int]]:
        """Send `message` (of call `k`) and wait up to `timeout_s` for the answer, with its descriptors (one outside
        the protocol is answered as `Failed`); CallFailed: "timeout" (`late` says what), "ended"."""
        try:
            send(self.sock, message)
            self.sock.settimeout(max(0.001, timeout_s))
            return receive(self.sock)
        except ProtocolError as exc:
            return Failed(k, f"the candidate answered outside the protocol ({exc})"), []
        except socket.timeout:
            raise CallFailed(late, "timeout") from None
        except (ConnectionError, OSError) as exc:
            raise CallFailed(f"the process ended during call {k} ({exc})", "ended") from None

    def _resume(self, what: str) -> None:
        try:
            self.freezer.resume()
        except CandidateGone as exc:
            raise CallFailed(f"the process ended before {what} ({exc})", "ended") from None

    @property
    def outside_ns(self) -> int:
        return sum(self.outside.values())

    def _mark_stopped(self) -> int:
        """Its CPU clocks and scheduling count as it stands stopped (what the next call's start compares); the sum
        of the clocks."""
        self.stopped_cpu = self.freezer.cpu_by_pid()
        self.stopped_switches = self.freezer.switches()
        return sum(self.stopped_cpu.values())

    def _cpu_before(self, k: int) -> int:
        """Its processes' CPU clock as call `k` starts, having checked they took none while stopped (CallFailed
        where they have ended meanwhile: killed at the judge's deadline, say; a verdict, never the reference
        worker's crash). A clock that moved while no thread was given a CPU is booked late, not run: the kernel books
        a running thread's time at a tick or when it leaves its CPU, and a thread that shows stopped can still be on
        it (the last to stop, say, notifying the parent under a contended lock): that time was the call's."""
        try:
            now = self.freezer.cpu_by_pid()
        except CandidateGone as exc:
            raise CallFailed(f"the process ended before call {k} ({exc})", "ended") from None
        if self.stopped_cpu is not None:
            moved = {pid: ns - self.stopped_cpu.get(pid, ns) for pid, ns in now.items()}
            if any(moved.values()) and self.stopped_switches is not None \
                    and self.freezer.switches() == self.stopped_switches:
                self.late_ns += sum(moved.values())
            else:
                self.outside_gaps += any(moved.values())
                for pid, ns in moved.items():
                    if ns:
                        self.outside[pid] = self.outside.get(pid, 0) + ns
        if self.outside_ns > OUTSIDE_LIMIT_NS:
            raise CallFailed(f"call {k}: the candidate's processes ran while stopped "
                             f"({self.outside_ns / 1e3:.0f} us of CPU between calls, {self._outside_detail(k)}): all "
                             "work must happen inside the calls")
        return sum(now.values())

    def _outside_detail(self, k: int) -> str:
        """Where the CPU time between calls went: in how many gaps, which process (and its threads' states now)."""
        parts = [f"in {self.outside_gaps} of {k} gaps, " + ("its threads given a CPU meanwhile"
                                                              if self.stopped_switches is not None
                                                              else "this kernel counting no schedules")]
        for pid, ns in sorted(self.outside.items(), key=lambda item: -item[1]):
            role = "its worker" if pid == self.worker_pid else f"process {pid}"
            states = "".join(sorted(thread_states(pid) or "?"))
            parts.append(f"{role} {ns / 1e3:.0f} us, thread states {states[:40]}")
        return "; ".join(parts)

    def _checked_reply(self, k: int, reply) -> Done:
        """Call `k`'s answer, once it is stopped: `done` for this call, and no process of its own started."""
        started = self._new_processes()
        if started:
            raise CallFailed(f"call {k}: the candidate started a process ({started[0]}): all work must happen in its "
                             "own process, inside the call")
        if isinstance(reply, Failed) and reply.k == k:
            raise CallFailed(reply.error[:2000])
        if not isinstance(reply, Done) or reply.k != k:
            raise CallFailed(f"call {k}: the candidate answered out of turn ({str(reply)[:200]})")
        return reply

    def prepare(self, fn: str, timeout_s: float) -> str | None:
        """Let the callee ready `fn` on the inputs loaded last, outside any timed call (torch.compile's
        compilation); its error, if any."""
        ident = next(i for i, b in self.buffers.values() if b is self.current)
        self._resume(f"preparing {fn}")
        self.stopped_cpu = None
        try:
            send(self.sock, Prepare(fn, ident))
            self.sock.settimeout(timeout_s)
            reply, fds = receive(self.sock)
            close_fds(fds)
        except (OSError, ConnectionError, ProtocolError) as exc:
            raise CallFailed(f"preparing {fn} failed ({exc})", "ended") from None
        finally:
            try:
                self.freezer.stop()
                self._mark_stopped()
            except CandidateGone as exc:
                raise CallFailed(f"preparing {fn}: the callee's process ended ({exc})", "ended") from None
        return reply.error if isinstance(reply, Prepared) else f"answered {str(reply)[:200]}"

    def _new_processes(self) -> list[int]:
        return [pid for pid in members(Path(self.cgroup)) if pid not in self.known] if self.cgroup else []

    def outputs(self, call: CallRecord, expected_bytes: int | None = None) -> tuple[list[Leaf], str]:
        """The call's outputs as leaves to compare (read from the stopped candidate's memory when compared), and a
        short description of their structure; at most `expected_bytes` read (the reference's outputs' size: a
        wrong shape described as gigabytes is not copied). Raises ValueError (`readback.Unreadable`) for a bad
        description."""
        inputs = mapped_files(self.worker_pid, NAME)
        limit = self.read_limit if expected_bytes is None else min(self.read_limit, expected_bytes)
        found = read_outputs(call.outputs, limit, inputs, process_reader(self.worker_pid))
        kinds = {str(item.get("path"))[:200]: item.get("kind") for item in call.outputs}
        leaves = [(path, "tensor" if kinds.get(path) == "tensor" else "value", lambda v=value: v)
                  for path, value in found]
        return leaves, "(" + ", ".join(str(kinds.get(p)) for p, _ in found) + ")"

    def memory_peak(self) -> int:
        """The most host memory the callee's worker has held (the kernel's high-water mark, in bytes; 0 if gone)."""
        try:
            status = open(f"/proc/{self.worker_pid}/status").read()
        except OSError:
            return 0
        line = next((ln for ln in status.splitlines() if ln.startswith("VmHWM:")), "VmHWM: 0 kB")
        return int(line.split()[1]) * 1024

    def changed_inputs(self) -> list[int]:
        assert self.current is not None
        return self.current.changed()

    def end(self, timeout_s: float = 30.0) -> list[str]:
        """Let the candidate's worker leave its call loop (resumed for good); what its in-process audits reported."""
        try:
            self._resume("the end of its calls")
            send(self.sock, End(secrets.randbelow(32) + 1))
            self.sock.settimeout(timeout_s)
            reply, fds = receive(self.sock)
            close_fds(fds)
        except (OSError, ConnectionError, ProtocolError) as exc:
            raise CallFailed(f"the process did not end its calls ({exc})", "ended") from None
        finally:
            self.close()
        if not isinstance(reply, Ended):
            raise CallFailed(f"the process answered {str(reply)[:200]} to the end of its calls")
        violations = [str(v) for v in reply.violations][:100]
        if self.sampler is not None:  # the trusted side's own view, beside the report above (the candidate's: where
            violations += self.sampler.violations()  # it is honest it names the op)
        if reply.calls != self.calls:  # (red team B: a native loop of the candidate's answered the others; a second
            # line only: the count comes from the candidate's process, which a proxy could rewrite as well)
            violations.insert(0, f"the harness's callee served {reply.calls} of the {self.calls} calls made: the "
                                 "others were answered by other code in the candidate's process (outside the "
                                 "harness's handshake and audits)")
        return violations

    def close(self) -> None:
        for _, buffer in self.buffers.values():
            buffer.close()
        self.buffers = {}
        self.sock.close()
        self.freezer.close()
        if self.sampler is not None:
            self.sampler.close()

