"""Probe for the cuda backend's trusted clock (issue 28's next step): can a trusted process time another process's GPU
work with its own CUDA events, ordered with that work through stream memory operations on shared GPU memory?

The timer (this process) shares a small GPU buffer of flags with a callee process (sandboxed as a candidate is, with
`--sandbox`; the buffer crosses as a file descriptor, `judge/wire/shared_memory.py`). Per call the callee enqueues on
its stream: wait until `go >= k`, the work, write `done = k`, and says it is armed; the timer then enqueues on its own
stream: event E0, write `go = k`, wait until `done >= k`, event E1. E1 - E0 is a window on the GPU's clock that the
callee cannot shorten: its work cannot start before `go`, and E1 cannot pass before `done`. The callee's own events
around its work give the work's device time; the difference is the clock's overhead (two cross-process semaphore
hops on the GPU). For comparison, the host handshake a CPU-side clock would use: the timer's wall clock around
"run now" and "done" over the socket, the callee synchronising.

    python3 benchmarks/gpu_clock_probe.py [--sandbox] [--calls 200] --out probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from cuda_agent.judge.wire.call_protocol import receive_message, send_message  # noqa: E402
from cuda_agent.judge.wire.process import receive_fds, send_fds  # noqa: E402
from cuda_agent.judge.wire.gpu_order import CalleeOrder, Flags, OrderTimeout, TrustedOrder, poll  # noqa: E402

SIZES = {"10us": 1 << 21, "100us": 1 << 24, "1ms": 1 << 27}  # float32 elements of x.mul_(...) (read + write)
WAIT_S = 5.0  # a call whose GPU work has not ended by then means the ordering does not work: give up, say so


def callee(sock: socket.socket) -> None:
    """The callee's side: arm the stream, do the work, report its own events."""
    order = CalleeOrder(Flags(receive_fds(sock, 1)[0]))
    stream = torch.cuda.Stream()
    xs = {name: torch.ones(n, device="cuda") for name, n in SIZES.items()}
    for x in xs.values():  # the kernel loaded now: CUDA loads modules lazily, and loading one synchronises the
        x.mul_(1.0)        # context, which deadlocks behind a stream that waits for `go`
    torch.cuda.synchronize()
    send_message(sock, {"op": "ready"})
    while True:
        msg, _ = receive_message(sock)
        if msg["op"] == "end":
            return
        x = xs[msg["size"]]
        b0, b1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if msg["op"] == "arm":
            with torch.cuda.stream(stream):
                order.arm(msg["k"], stream)
                b0.record()
                x.mul_(1.0000001)
                b1.record()
                order.release(msg["k"], stream)
            send_message(sock, {"op": "armed"})
            poll(b1, time.monotonic() + WAIT_S, "the callee's work after `go`")
        else:  # "run": the host handshake
            with torch.cuda.stream(stream):
                b0.record()
                x.mul_(1.0000001)
                b1.record()
            poll(b1, time.monotonic() + WAIT_S, "the callee's work")
            send_message(sock, {"op": "done"})
        receive_message(sock)  # "report?"
        send_message(sock, {"op": "report", "work_ms": b0.elapsed_time(b1)})


def timer(args) -> dict:
    flags = Flags()
    order = TrustedOrder(flags)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    command = [sys.executable, __file__, "--callee", str(theirs.fileno())]
    box = None
    if args.sandbox:
        from cuda_agent import sandbox

        box = sandbox.Sandbox(sandbox.View(), sandbox.Limits(cpu_seconds=None))
        command = [*box.prefix(), *command]
    proc = subprocess.Popen(command, pass_fds=[theirs.fileno()])
    theirs.close()
    send_fds(ours, [flags.fd])
    ours.settimeout(120)
    assert receive_message(ours)[0]["op"] == "ready"
    print("callee ready", flush=True)
    results, k = {}, 0
    for size in SIZES:
        rows = {"gpu_window_us": [], "host_window_us": [], "work_us": []}
        for i in range(args.calls):
            k += 1
            send_message(ours, {"op": "arm", "k": k, "size": size})
            receive_message(ours)
            window_us = order.open(k).elapsed_us(time.monotonic() + WAIT_S)
            send_message(ours, {"op": "report?"})
            work = receive_message(ours)[0]["work_ms"] * 1e3
            t0 = time.perf_counter()
            send_message(ours, {"op": "run", "size": size})
            receive_message(ours)
            host = (time.perf_counter() - t0) * 1e6
            send_message(ours, {"op": "report?"})
            receive_message(ours)
            if i >= 10:  # warm-up calls
                rows["gpu_window_us"].append(window_us)
                rows["host_window_us"].append(host)
                rows["work_us"].append(work)
        med = {key: statistics.median(v) for key, v in rows.items()}
        med["gpu_overhead_us"] = med["gpu_window_us"] - med["work_us"]
        med["host_overhead_us"] = med["host_window_us"] - med["work_us"]
        med["gpu_window_p20_p80_us"] = [sorted(rows["gpu_window_us"])[len(rows["gpu_window_us"]) // 5],
                                        sorted(rows["gpu_window_us"])[4 * len(rows["gpu_window_us"]) // 5]]
        results[size] = {key: round(v, 2) if isinstance(v, float) else v for key, v in med.items()}
        print(size, results[size], flush=True)
    send_message(ours, {"op": "end"})
    proc.wait(timeout=60)
    if box:
        box.close()
    yama = Path("/proc/sys/kernel/yama/ptrace_scope")
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "sandboxed": args.sandbox,
            "calls": args.calls, "yama_ptrace_scope": yama.read_text().strip() if yama.exists() else None,
            "sizes": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callee", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sandbox", action="store_true", help="run the callee in the candidate's sandbox")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    try:
        if args.callee is not None:
            callee(socket.socket(fileno=args.callee))
            return
        result = timer(args)
    except OrderTimeout as exc:  # a stream still waits for a flag: leave without the driver's teardown
        print(f"TIMEOUT: {exc}", file=sys.stderr, flush=True)
        os._exit(3)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
