"""The candidate's side of its calls, in the candidate's process: nothing here decides a verdict.

The trusted side (the reference worker, `trusted_calls.py`) drives every call over a socket of their own: it sends
the input buffers to map (`inputs`), then, with the candidate's processes resumed for just that long, `call`; this
side runs `forward` on the mapped inputs and answers `done` with where the outputs lie (and what the in-process op
audit saw, a second line of defence). The clock, the inputs' values, which outputs are read and the comparison
are the trusted side's. Between calls the candidate's processes are stopped.
"""

from __future__ import annotations

import socket
from typing import Any, Callable

import torch

from ..wire.call_protocol import Call, Done, End, Ended, Failed, Inputs, Prepare, Prepared, receive, send
from ..wire.input_buffers import map_inputs
from ..wire.process import one_line
from ..wire.tensors import leaves


def describe(out: Any) -> list[dict[str, Any]]:
    """Where each output leaf lies in this process's memory (tensors) or its value."""
    found = []
    for path, x in leaves(out):
        if isinstance(x, torch.Tensor):
            if type(x) is not torch.Tensor:
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
                 prepare: Callable[[str, list], None] | None = None):
        self.sock, self.forward, self.prepare = sock, forward, prepare
        self.inputs: dict[int, list] = {}
        self.last: Any = None  # the last call's outputs stay alive until the trusted side has read them

    def serve(self) -> tuple[int, int]:
        """Returns the number of calls served, and how many canary ops the trusted side's `end` asks the audits to
        see (its challenge: `audit.ThreadAudit.challenge`)."""
        calls = 0
        while True:
            msg, fds = receive(self.sock)
            if isinstance(msg, Inputs):
                self.inputs[msg.id] = map_inputs(fds[0], msg.layout)
            elif isinstance(msg, Call):
                calls += 1
                send(self.sock, self._call(msg.k, self.inputs[msg.inputs], msg.fn))
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
        self.last = None
        try:
            self.last = self.forward(inputs, fn)
        except Exception as exc:  # the candidate's failure, reported as such
            return Failed(k, one_line(exc))
        return Done(k, describe(self.last))
