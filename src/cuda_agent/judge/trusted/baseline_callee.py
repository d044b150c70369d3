"""Eager and torch.compile of the reference, served as calls exactly as the candidate's are (`callee.py`).

The trusted side times baselines and candidate with one clock: each call's window runs from resuming a stopped
process to stopping it again, handshake included. Timing eager inside the reference worker would spare the
baselines that handshake (hundreds of microseconds on a small virtual machine, where an idle core wakes slowly) and
make every candidate look slower than it is. This process runs only the task's code: the reference worker starts
it, writes its inputs into the same kind of buffer and stops it between calls, as it does the candidate's.

Usage (by the reference worker, `start`): python -m cuda_agent.judge.trusted.baseline_callee REQUEST_JSON
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from typing import Any

import torch

from ...backend import get_backend
from ...task import import_file
from ..candidate.callee import Callee
from ..wire.call_protocol import Failed, Ready, receive, send
from .trusted_calls import Calls

READY_TIMEOUT_S = 300.0


def start(request: dict[str, Any], read_limit: int, calls: type[Calls] = Calls) -> tuple[Calls, subprocess.Popen]:
    """Start the baseline callee for the reference worker's task (`request`: task_path, backend, allow_tf32,
    compile_mode, seed, output_pool) and return its calls, once it has built the model and stopped."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        proc = subprocess.Popen([sys.executable, "-m", __spec__.name,
                                 json.dumps({**request, "fd": theirs.fileno(), "parent": os.getpid()})],
                                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)  # (not the worker's commands)
    atexit.register(proc.kill)  # (and it dies with this process in any case: `die_with`)
    ours.settimeout(READY_TIMEOUT_S)
    try:
        ready, _ = receive(ours)
    except (OSError, ConnectionError, ValueError) as exc:  # (a failure to start is sent as no protocol message)
        proc.kill()
        raise RuntimeError(f"the baseline callee did not start ({exc})") from None
    if not isinstance(ready, Ready):
        proc.kill()
        raise RuntimeError(f"the baseline callee failed: {getattr(ready, 'error', ready)}")
    return calls(ours, [proc.pid], proc.pid, read_limit), proc


PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> None:
    """Be killed when the reference worker that started this process ends, however it ends (a stopped, orphaned
    callee would hold memory, and the pipes of whoever reads the reference worker's output, for good)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)


def main() -> None:
    req = json.loads(sys.argv[1])
    die_with(int(req["parent"]))
    sock = socket.socket(fileno=int(req["fd"]))
    backend = get_backend(req["backend"])
    backend.precision_flags(req["allow_tf32"])
    try:
        module = import_file(req["task_path"], "baseline_task")
        torch.manual_seed(int(req["seed"]))
        with torch.device(backend.device):
            model = module.Model(*module.get_init_inputs()).to(backend.device).eval()
    except Exception as exc:
        send(sock, Failed(-1, f"{type(exc).__name__}: {exc}"[:2000]))
        return
    models: dict[str, Any] = {"eager": model}

    def prepare(fn: str, inputs: list) -> None:
        if fn == "compile" and fn not in models:
            mode = req["compile_mode"]
            models[fn] = torch.compile(model, mode=None if mode == "default" else mode)
        forward(inputs, fn)  # a first call: torch.compile compiles here

    def forward(inputs: list, fn: str) -> Any:
        if fn == "null":  # one empty kernel: the GPU clock's own overhead (`gpu_calls.calibrate`)
            torch.cuda._sleep(0)
            return None
        with torch.no_grad():
            out = models[fn or "eager"](*inputs)
        if callee.order is None:  # (ordered on the GPU, the trusted side's window holds the work)
            backend.synchronize()
        return out

    callee = Callee(sock, forward, prepare, pool_library=req.get("output_pool"))
    send(sock, Ready())
    callee.ended(callee.serve()[0], [])


if __name__ == "__main__":
    main()
