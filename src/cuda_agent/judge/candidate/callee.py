"""The candidate's side of its calls, in the candidate's process: nothing here decides a verdict.

The trusted side (the reference worker, `trusted_calls.py`) drives every call over a socket of their own: it sends
the input buffers to map (`inputs`), then, with the candidate's processes resumed for just that long, `call`; this
side runs `forward` on the mapped inputs and answers `done` with where the outputs lie (and what the in-process op
audit saw, a second line of defence). The clock, the inputs' values, which outputs are read and the comparison
are the trusted side's. Between calls the candidate's processes are stopped.

On the GPU (after `order`) each call's work is queued between a wait for the trusted side's `go` and a write of
`done` on the call's stream (`gpu_order.py`), its outputs allocated from a pool the trusted side maps
(`output_pool.py`); `forward` must not wait for its own work (the trusted side opens the window once `done` is
answered, or, for a forward that waits, after a grace period).
"""

from __future__ import annotations

import socket
from collections import deque
from typing import Any, Callable

import torch

from ..wire.call_protocol import (
    HELD_CALLS,
    Call,
    Done,
    End,
    Ended,
    Failed,
    Inputs,
    Order,
    Poll,
    Prepare,
    Prepared,
    Running,
    receive,
    send,
)
from ..wire.gpu_order import CalleeOrder, Flags, flag_value
from ..wire.input_buffers import map_inputs
from ..wire.process import close_fds, one_line, raised_at
from ..wire.tensors import leaves


def describe(out: Any) -> list[dict[str, Any]]:
    """Where each output leaf lies in this process's memory (tensors) or its value."""
    found = []
    for path, x in leaves(out):
        if isinstance(x, torch.Tensor):
            if type(x) not in (torch.Tensor, torch.nn.Parameter):  # (a Parameter is a plain tensor to compare)
                found.append({"path": path, "kind": "subclass", "type": type(x).__name__})
            else:
                found.append({"path": path, "kind": "tensor", "dtype": str(x.dtype).removeprefix("torch."),
                              "shape": list(x.shape), "strides": list(x.stride()), "ptr": x.data_ptr(),
                              "device": x.device.type})
        elif x is None or isinstance(x, (bool, int, float)):
            found.append({"path": path, "kind": "value", "value": x})
        else:
            found.append({"path": path, "kind": "object", "type": type(x).__name__})
    return found


class Callee:
    """Serves the trusted side's calls until it says `end` (then `ended` answers it). `forward(inputs, fn)` runs the
    candidate (audited) and returns its outputs (`fn` names what to run where a process serves several: the baseline
    callee's eager and torch.compile); `prepare(fn, inputs)`, where given, readies one outside any timed call (a
    compilation)."""

    def __init__(self, sock: socket.socket, forward: Callable[[list, str], Any],
                 prepare: Callable[[str, list], None] | None = None, pool_library: str | None = None):
        """`pool_library`: the output pool's allocator (`output_pool.build`), for calls ordered on the GPU."""
        self.sock, self.forward, self.prepare, self.pool_library = sock, forward, prepare, pool_library
        self.inputs: dict[int, list] = {}
        self.mappings: dict[int, Any] = {}  # the memory the inputs lie in, kept while they are used
        self.last: Any = None  # the last call's outputs stay alive until the trusted side has read them
        # (cpu) and through the next HELD_CALLS calls, as a caller that keeps them would: the trusted side reads them
        # again after each (memory the candidate returned must not change under its caller)
        self.held: deque = deque(maxlen=HELD_CALLS)
        self.order: CalleeOrder | None = None
        self.pool = None

    def serve(self) -> tuple[int, int]:
        """Returns the number of calls served, and how many canary ops the trusted side's `end` asks the audits to
        see (its challenge: `audit.ThreadAudit.challenge`)."""
        calls = 0
        while True:
            msg, fds = receive(self.sock)
            if isinstance(msg, Inputs):
                self.inputs[msg.id], self.mappings[msg.id] = map_inputs(fds[0], msg.layout)
            elif isinstance(msg, Order):
                from .output_pool import OutputPool

                self.order, self.pool = CalleeOrder(Flags(fds[0])), OutputPool(str(self.pool_library))
                close_fds(fds)
            elif isinstance(msg, Call):
                calls += 1
                reply, shared = self._ordered_call(msg.k, self.inputs[msg.inputs], msg.fn) if self.order else \
                    (self._call(msg.k, self.inputs[msg.inputs], msg.fn), [])
                send(self.sock, reply, shared)
                close_fds(shared)
            elif isinstance(msg, Poll):
                send(self.sock, self._poll(msg.k))
            elif isinstance(msg, Prepare) and self.prepare is not None:
                try:
                    self.prepare(msg.fn, self.inputs[msg.inputs])
                    send(self.sock, Prepared())
                except Exception as exc:  # e.g. torch.compile fails on the task: the baseline says so
                    send(self.sock, Prepared(one_line(exc)))
            elif isinstance(msg, End):
                return calls, max(0, min(msg.canary, 1000))

    def ended(self, calls: int, violations: list[str]) -> None:
        """The answer to `end`: what the in-process audits saw (a second line of defence)."""
        send(self.sock, Ended(calls, violations))
        self.sock.close()

    def _call(self, k: int, inputs: list, fn: str) -> Done | Failed:
        self.held.append(self.last)
        self.last = None
        try:
            self.last = self.forward(inputs, fn)
        except Exception as exc:  # the candidate's failure, reported as such
            return Failed(k, one_line(exc) + raised_at(exc))
        return Done(k, describe(self.last))

    def _poll(self, k: int) -> Running | Failed:
        """Whether the call's stream has failed (a sticky error of this context: an illegal memory access)."""
        try:
            if self.order is not None:
                self.order.stream.query()
        except RuntimeError as exc:
            return Failed(k, one_line(exc))
        return Running(k)

    def _ordered_call(self, k: int, inputs: list, fn: str) -> tuple[Done | Failed, list[int]]:
        """The call's work queued between `go` and `done` on the current stream, its outputs in the pool (copied
        there, inside the window, where `forward` made them elsewhere)."""
        self.last = None
        self.order.arm(flag_value(k))
        try:
            with torch.cuda.stream(self.order.stream), self.pool.allocating():
                out = self.forward(inputs, fn)
                found, fds, self.last = self.pool.describe(out)
        except Exception as exc:  # the candidate's failure, reported as such
            return Failed(k, one_line(exc) + raised_at(exc)), []
        finally:
            self.order.release(flag_value(k))
        return Done(k, found), fds
