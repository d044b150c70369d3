"""Calls on the GPU, measured by the trusted side's own events (the cuda backend's trusted path).

Per call: the callee's processes are resumed and told `call`; the callee queues the call's work behind a wait for
`go` and a write of `done` on its stream, its outputs allocated from a pool whose blocks it shares (`output_pool.py`),
and answers `done`; it is stopped again. Then, on this process's stream, in one burst: the call's inputs written
into the buffer it maps, the L2 flushed, event E0, `go`, a wait for `done`, event E1, and the outputs copied out
of its blocks (`gpu_order.py`). Its work cannot start before E0 and holds the GPU until E1; what it leaves
unfinished past the GPU's time slice is missing from the copy. A `forward` that waits for its own work would wait
for `go` for good: after `LATE_GO_S` the window opens anyway, and closes only once `done` has been answered.

The window's constant part (two context switches, ~285-310 us on the H200) is measured on the baseline callee's
empty calls and subtracted: first once (`calibrate`: a candidate's call whose window is shorter than that ran its work
outside it and fails), then by empty calls just before and just after the timed calls (it drifts by microseconds
over a run: a constant measured at the start read a 1.5 us kernel as -3 us on the H200; not between the timed calls:
a window that follows another process's call holds one more context switch, which read a 2.6 us kernel as 10 us on
the H200, where eager's calls, following its own empty calls, paid none). Timed calls are charged less the smaller
of the two medians: another context's work on the GPU only lengthens empty windows (it takes time slices of ~2.1 ms),
so neither can be inflated to shorten a call; and when the empty windows show such work (spread wide, longer than
calibrated, or a calibration over `MAX_OVERHEAD_US`) the timing is marked `gpu_shared` and credits no speed
(`timekeeper.py`). A call costs at least `RESOLUTION_US`: the clock cannot tell shorter work from the drift of its
own overhead. The host's
part of a call (from `call` to its answer, about 1 ms with a jitter of hundreds of microseconds: the stopped processes
resumed and stopped again) is recorded but not charged: work queued before the window cannot see the call's inputs,
which are written inside it, so whatever depends on them runs inside the window (a `forward` that waits for its own
work: on the host too, in a late window), as launches queued ahead do for eager and candidate alike.
"""

from __future__ import annotations

import socket
import statistics
import time
from typing import Any

import torch

from ..wire.call_protocol import Call, Failed, Order, Poll, ProtocolError, Running, receive, send
from ..wire.gpu_order import Flags, OrderTimeout, TrustedOrder, flag_value
from ..wire.input_buffers import InputBuffer
from ..wire.process import close_fds
from ..wire.shared_memory import DeviceBuffer
from .compare import Leaf
from .freezer import CandidateGone
from .readback import Unreadable, read_outputs
from .trusted_calls import CallFailed, CallRecord, Calls

LATE_GO_S = 0.1  # how long a callee may take to queue a call before the window opens without its `done`
POLL_S = 1.0  # how often the callee is asked whether a call's GPU work that has not ended has failed
POLL_ANSWER_S = 30.0
BELOW_OVERHEAD_US = 20.0  # a window this far under the calibrated overhead ran its work outside the window
RESOLUTION_US = 5.0  # the least a call costs: the overhead's drift between calibrations (measured: up to ~5 us)
SHARED_SPREAD_US = 50.0  # empty windows spread wider (p20-p80), or this much longer than calibrated: a shared GPU
MAX_OVERHEAD_US = 1000.0  # an empty window's median above this (half a time slice) held another context's work
CALIBRATION_ROUNDS = 3
SLICE_CHECKED_US = 1000.0  # a window this long may have cut work queued after `done` (the GPU's time slice, ~2.1 ms)
MAX_BLOCKS = 4096
DRAIN_S = 30.0  # how long closing waits for this side's queued reads of a callee's memory
_STILL_IN_USE: list = []  # memory whose queued reads did not end in time: never unmapped


class GpuCalls(Calls):
    """`Calls` whose clock, inputs and output reads are on the GPU, ordered with the callee's stream."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.flags = Flags()
        self.order = TrustedOrder(self.flags)
        send(self.sock, Order(), [self.flags.fd])
        self.blocks: dict[int, DeviceBuffer] = {}
        self.staged: list | None = None
        self.read: list[tuple[str, Any]] | Unreadable = []
        self.overhead_us: float | None = None  # the window's constant part, once calibrated
        self.clock: GpuCalls = self  # whose calibration applies (a candidate's: the baseline callee's)
        self.checks_overhead = True  # (not while calibrating: empty calls are the overhead)
        self.calibration_problem: str | None = None

    def load(self, inputs: list) -> InputBuffer:
        """Stage a call's inputs: they are written into the callee's buffer inside the call's window."""
        self.staged = inputs
        return self._select(inputs)

    def call(self, deadline: float, fn: str = "", flush=None, sampled: bool = False) -> CallRecord:
        assert self.current is not None and self.staged is not None, "load inputs first"
        ident = next(i for i, b in self.buffers.values() if b is self.current)
        k, self.calls = self.calls, self.calls + 1
        cpu0 = self._cpu_before(k)
        t0 = time.perf_counter_ns()
        self._resume(f"call {k}")
        window = None
        try:
            send(self.sock, Call(k, ident, fn))
            self.sock.settimeout(max(0.001, min(LATE_GO_S, deadline - time.monotonic())))
            try:
                reply, fds = receive(self.sock)
            except socket.timeout:  # it waits for its own work: open the window, then wait for its answer
                window = self._open(k, flush, close=False)
                self.sock.settimeout(max(0.001, deadline - time.monotonic()))
                reply, fds = receive(self.sock)
        except ProtocolError as exc:
            reply, fds = Failed(k, f"the candidate answered outside the protocol ({exc})"), []
        except socket.timeout:
            self._abandon(window)
            raise CallFailed(f"call {k} did not return in time", "timeout") from None
        except (ConnectionError, OSError) as exc:
            self._abandon(window)
            raise CallFailed(f"the process ended during call {k} ({exc})", "ended") from None
        finally:
            try:
                self.freezer.signal_stop()
            except CandidateGone:
                pass
        host_ns = time.perf_counter_ns() - t0
        try:
            self.freezer.settle()
            cpu1 = self._mark_stopped()
            reply = self._checked_reply(k, reply)
            self._map_blocks(reply.outputs, fds)
        except CandidateGone as exc:
            self._abandon(window)
            raise CallFailed(f"the process ended during call {k} ({exc})", "ended") from None
        except CallFailed:
            self._abandon(window)
            raise
        finally:
            close_fds(fds)
        if window is None:
            window = self._open(k, flush, close=True, outputs=reply.outputs)
        else:
            self.order.close(window, after=lambda: self._read(reply.outputs))
        try:
            elapsed = self._elapsed(window, k, deadline)
        except OrderTimeout:
            self.order.abandon(window)
            raise CallFailed(f"call {k}: its GPU work did not end in time", "timeout") from None
        except CallFailed:
            self.order.abandon(window)
            raise
        self.order.stream.synchronize()  # (the outputs' copies)
        overhead = self.clock.overhead_us
        if overhead is not None and self.checks_overhead and not self.clock.calibration_problem \
                and elapsed < overhead - BELOW_OVERHEAD_US:  # (a calibration on a shared GPU is too long to tell)
            raise CallFailed(f"call {k}: its window ({elapsed:.0f} us) is shorter than the GPU clock's own overhead "
                             f"({overhead:.0f} us): its work ran outside the call")
        return CallRecord(k, self.cost_us(elapsed, overhead or 0.0), (cpu1 - cpu0) / 1e3, reply.outputs,
                          elapsed, host_ns / 1e3)

    @staticmethod
    def cost_us(window_us: float, overhead_us: float) -> float:
        """A call's time: its window less the clock's constant part, no less than the clock's resolution."""
        return max(RESOLUTION_US, window_us - overhead_us)

    def must_check(self, call: CallRecord) -> bool:
        """A window that may have been cut by the time slice: work queued after `done` would be unfinished when its
        outputs were read, so they are compared, every such call (a read limit of 0: outputs never read)."""
        return self.read_limit > 0 and call.raw_us >= SLICE_CHECKED_US

    def _elapsed(self, window, k: int, deadline: float) -> float:
        """The window once it has closed. Until then the callee is asked every `POLL_S` whether the call's work has
        failed (a context that died, of an illegal memory access say, never writes `done`): its answer can only
        fail the call, never end the window."""
        while True:
            try:
                return window.elapsed_us(min(deadline, time.monotonic() + POLL_S))
            except OrderTimeout:
                if time.monotonic() >= deadline:
                    raise
            self._poll(k)

    def _poll(self, k: int) -> None:
        self._resume(f"polling call {k}")
        try:
            reply, fds = self._ask(k, Poll(k), POLL_ANSWER_S, f"call {k}: no answer to a poll while its GPU work ran")
            close_fds(fds)
        finally:
            try:
                self.freezer.stop()
                self._mark_stopped()  # (its answer's CPU time is no work between calls)
            except CandidateGone:
                pass
        if isinstance(reply, Failed) and reply.k == k:
            raise CallFailed(reply.error[:2000])
        if not isinstance(reply, Running) or reply.k != k:
            raise CallFailed(f"call {k}: the candidate answered out of turn ({str(reply)[:200]})")

    def _abandon(self, window) -> None:
        """A window opened for a call that failed: this side's stream must not wait for its `done` for good."""
        if window is not None:
            self.order.abandon(window)

    def _open(self, k: int, flush, close: bool, outputs: list | None = None):
        def before():
            self.current.write(self.staged)
            if flush is not None:
                flush()
        return self.order.open(flag_value(k), before=before, after=(lambda: self._read(outputs)) if close else None,
                               close=close)

    def _map_blocks(self, outputs: list, fds: list[int]) -> None:
        """Map the output blocks it shared with this answer (in the order of its outputs' `new_block`s)."""
        new = [leaf for leaf in outputs if isinstance(leaf, dict) and leaf.get("new_block")]
        if len(new) != len(fds) or len(self.blocks) + len(fds) > MAX_BLOCKS:
            raise CallFailed(f"invalid output: {len(fds)} memory blocks shared for {len(new)} new ones")
        for leaf, fd in zip(new, fds):
            serial, size = leaf.get("block"), leaf.get("block_size")
            if type(serial) is not int or type(size) is not int or size <= 0 or serial in self.blocks:
                raise CallFailed("invalid output: a malformed memory block")
            try:
                self.blocks[serial] = DeviceBuffer.open(fd, size, torch.cuda.current_device())
            except RuntimeError as exc:
                raise CallFailed(f"invalid output: its memory block could not be mapped ({exc})") from None

    def _read(self, outputs: list) -> None:
        """Copy the outputs out of its blocks, on this stream (queued before the window's end passes)."""
        def read(leaf: dict, span: int) -> torch.Tensor:
            block = self.blocks.get(leaf.get("block"))
            if block is None or leaf["ptr"] + span > block.nbytes:
                raise Unreadable("not in memory it shared")
            return block.tensor()[leaf["ptr"]:leaf["ptr"] + span]
        try:
            self.read = read_outputs(outputs, self.read_limit, [], read)
        except Unreadable as exc:
            self.read = exc

    def outputs(self, call: CallRecord, expected_bytes: int | None = None) -> tuple[list[Leaf], str]:
        """The last call's outputs as copied right after its window (Unreadable for a bad description; copied
        then, under the call's own limit, so `expected_bytes` changes nothing here)."""
        if isinstance(self.read, Unreadable):
            raise self.read
        kinds = {str(item.get("path"))[:200]: item.get("kind") for item in call.outputs if isinstance(item, dict)}
        leaves = [(path, "tensor" if kinds.get(path) == "tensor" else "value", lambda v=value: v)
                  for path, value in self.read]
        return leaves, "(" + ", ".join(str(kinds.get(p)) for p, _ in self.read) + ")"

    def changed_inputs(self) -> list[int]:
        assert self.current is not None
        return self.current.changed()

    def calibrate(self, inputs: list, deadline: float, calls: int = 20) -> float:
        """The window's constant part: the median window of empty calls (one empty kernel each), taken again (up to
        `CALIBRATION_ROUNDS` times) while they show another context's work on the GPU; `calibration_problem` says
        when they still did."""
        self.load(inputs)
        self.overhead_us = None
        for _ in range(CALIBRATION_ROUNDS):
            empty = [self.empty_window(deadline) for _ in range(calls)][calls // 4:]
            median = statistics.median(empty)
            self.overhead_us = median if self.overhead_us is None else min(self.overhead_us, median)
            self.calibration_problem = shared_gpu(empty, None)
            if self.calibration_problem is None:
                break
        return self.overhead_us

    def overhead_of(self, empty: list[float]) -> tuple[float, str | None]:
        """What timed calls are charged less, from the empty calls made after each: the smaller of their median and
        the calibration (neither can be lengthened to shorten a call), and why the GPU looks shared, if it does."""
        assert self.overhead_us is not None, "calibrate first"
        problem = self.calibration_problem and f"its calibration: {self.calibration_problem}"
        return min(self.overhead_us, statistics.median(empty)), shared_gpu(empty, self.overhead_us) or problem

    def empty_window(self, deadline: float) -> float:
        """The window of one empty call (the baseline callee's `null`) on the inputs loaded last."""
        self.checks_overhead = False
        try:
            return self.call(deadline, "null").raw_us
        finally:
            self.checks_overhead = True

    def close(self) -> None:
        """Unmap its blocks and buffers once this side's stream has ended its work on them (a failed call's window
        is abandoned, but its output copies may still be queued behind another context's time slice: unmapped
        under them, they fault and this process's CUDA context is lost for every later evaluation). Memory still in
        use after `DRAIN_S` is kept mapped for good rather than unmapped under running work."""
        if not drained(self.order.stream, DRAIN_S):
            _STILL_IN_USE.append((self.blocks, self.buffers))
            self.buffers = {}
        self.blocks = {}
        super().close()


def drained(stream: torch.cuda.Stream, timeout_s: float) -> bool:
    """Whether the work queued on `stream` so far ends within `timeout_s` (polled: never a wait without end)."""
    done = torch.cuda.Event()
    done.record(stream)
    deadline = time.monotonic() + timeout_s
    while not done.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """Median, p20 and p80."""
    ordered = sorted(values)
    return (statistics.median(ordered), ordered[int(0.2 * (len(ordered) - 1) + 0.5)],
            ordered[int(0.8 * (len(ordered) - 1) + 0.5)])


def shared_gpu(empty: list[float], calibrated: float | None) -> str | None:
    """Why empty windows show another context's work on the GPU (it is scheduled in time slices of ~2.1 ms, so
    windows that wait for it spread and lengthen), or None."""
    median, low, high = quantiles(empty)
    if high - low > SHARED_SPREAD_US:
        return f"empty calls' windows spread {low:.0f}-{high:.0f} us (p20-p80): another context ran work on the GPU"
    if calibrated is not None and median > calibrated + SHARED_SPREAD_US:
        return (f"empty calls' windows took {median:.0f} us, {calibrated:.0f} us when calibrated: another context ran "
                "work on the GPU")
    if median > MAX_OVERHEAD_US:
        return f"empty calls' windows took {median:.0f} us: another context ran work on the GPU"
    return None
