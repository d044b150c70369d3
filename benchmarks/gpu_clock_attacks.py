"""Probe: can a callee that reads the trusted GPU clock's design (`gpu_clock_probe.py`) shorten its window?

The timer's window per call, on its own stream: write `gen = k` (standing for the call's fresh inputs), event E0,
write `go = k`, wait until `done >= k`, event E1, then copy the `finished` flag out (what the callee's work had
written by the time the timer's context ran again). The callee's work is `torch.cuda._sleep` (a spin of a known
length). Cases, each timed over `--calls` calls:

- honest: its stream waits for `go`, works, writes `finished` and `done`.
- empty: waits for `go`, writes `done` (the clock's constant overhead).
- after_done: its stream writes `done` right after `go`; a second stream waits for `go`, works, writes `finished`.
  Does the window still hold the work (the GPU runs one context at a time), and was it finished when E1 passed?
- before_go: a second stream works at once (not waiting for `go`), then copies `gen` to `seen`; its first stream
  waits for `go`, writes `done`. Work done before `go` is outside the window: does it ever see this call's `gen`?
- spinning: honest, with a 3 ms spin queued on a second stream (not waiting for `go`) at each arm: does a busy
  context make the window shorter than the honest one (a cheaper switch than the calibrated one)?
- copy_only: its stream waits for `go`, copies a buffer (copy engine, no kernel), writes `done`: does work without
  a kernel skip the context switch the overhead is calibrated with? (work: MB copied; its own events say how long)
- big_stack: honest, after raising the context's stack limit to 64 KiB per thread (a larger context to switch).
- null_stream: honest on the legacy default stream (where kernels launched without a stream go), then it copies
  `gen` to `seen`: is work there ordered after `go` too?

Also checks the output path: a pluggable allocator (`--pool-lib`, built by the caller) whose memory is exported as
file descriptors; the callee allocates a tensor under `torch.cuda.use_mem_pool`, fills it, and the timer maps and
reads it.

    python3 benchmarks/gpu_clock_attacks.py [--sandbox] [--calls 40] [--cases ...] [--pool-lib LIB.so] --out F.json
"""

from __future__ import annotations

import argparse
import ctypes
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
from cuda_agent.judge.wire.gpu_order import (DONE, CalleeOrder, Flags, OrderTimeout, TrustedOrder,  # noqa: E402
                                              write_value)
from cuda_agent.judge.wire.shared_memory import DeviceBuffer  # noqa: E402

FINISHED, GEN, SEEN = 32, 48, 64  # int32 slots of the flag buffer beside `go` and `done` (64 bytes apart)
WAIT_S = 30.0
WORK_US = [0, 10, 100, 1000, 10000]
CASES = ["empty", "honest", "after_done", "before_go", "spinning", "copy_only", "big_stack", "null_stream"]
COPY_MB = {0: 1, 10: 1, 100: 64, 1000: 512, 10000: 2048}  # copy_only: bytes copied (MB) in place of each work length


def cycles_per_us() -> float:
    torch.cuda._sleep(1000)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(2_000_000)
    e1.record()
    e1.synchronize()
    return 2_000_000 / (e0.elapsed_time(e1) * 1e3)


def callee(sock: socket.socket, pool_lib: str | None) -> None:
    flags = Flags(receive_fds(sock, 1)[0])
    order = CalleeOrder(flags)
    words = flags.buffer.tensor().view(torch.int32)
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    rate = cycles_per_us()
    copies = {mb: (torch.empty(mb << 18, device="cuda"), torch.empty(mb << 18, device="cuda"))
              for mb in set(COPY_MB.values())}
    for src, dst in copies.values():
        dst.copy_(src)
    copy_us: dict[int, list[float]] = {mb: [] for mb in copies}
    words[SEEN:SEEN + 1].copy_(words[GEN:GEN + 1])  # the copy kernel loaded before the first ordered call
    torch.cuda.synchronize()
    send_message(sock, {"op": "ready", "cycles_per_us": rate})
    while True:
        msg, _ = receive_message(sock)
        if msg["op"] == "end":
            break
        k, case, cycles = msg["k"], msg["case"], int(msg["work_us"] * rate)
        if case == "big_stack" and not getattr(callee, "stack_raised", False):
            rc = ctypes.CDLL("libcuda.so.1").cuCtxSetLimit(0, ctypes.c_size_t(65536))  # CU_LIMIT_STACK_SIZE
            assert rc == 0, f"cuCtxSetLimit: CUDA error {rc}"
            callee.stack_raised = True
        write = lambda stream, slot: write_value(stream, flags.address(slot), k)  # noqa: E731
        wait_go = lambda stream: order.arm(k, stream)  # noqa: E731
        if case == "copy_only":
            src, dst = copies[COPY_MB[msg["work_us"]]]
            c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(a):
                wait_go(a)
                c0.record()
                dst.copy_(src)
                c1.record()
                write(a, FINISHED)
                write(a, DONE)
        if case in ("honest", "empty", "spinning", "big_stack"):
            if case == "spinning":
                with torch.cuda.stream(b):
                    torch.cuda._sleep(int(3000 * rate))
            with torch.cuda.stream(a):
                wait_go(a)
                if case != "empty":
                    torch.cuda._sleep(cycles)
                write(a, FINISHED)
                write(a, DONE)
        elif case == "after_done":
            with torch.cuda.stream(b):
                wait_go(b)
                torch.cuda._sleep(cycles)
                write(b, FINISHED)
            with torch.cuda.stream(a):
                wait_go(a)
                write(a, DONE)
        elif case == "null_stream":
            null = torch.cuda.default_stream()
            with torch.cuda.stream(null):
                wait_go(null)
                torch.cuda._sleep(cycles)
                words[SEEN:SEEN + 1].copy_(words[GEN:GEN + 1])
                write(null, FINISHED)
                write(null, DONE)
        elif case == "before_go":
            with torch.cuda.stream(b):
                torch.cuda._sleep(cycles)
                words[SEEN:SEEN + 1].copy_(words[GEN:GEN + 1])
                write(b, FINISHED)
            with torch.cuda.stream(a):
                wait_go(a)
                write(a, DONE)
        send_message(sock, {"op": "armed"})
        receive_message(sock)  # "settled?": the timer has seen E1; let every queued piece of work end
        torch.cuda.synchronize()
        if case == "copy_only":
            copy_us[COPY_MB[msg["work_us"]]].append(c0.elapsed_time(c1) * 1e3)
        send_message(sock, {"op": "settled"})
    send_message(sock, {"op": "copies", "copy_us": {mb: statistics.median(v) for mb, v in copy_us.items() if v}})
    if pool_lib:
        pool_check(pool_lib, sock)


def pool_check(lib_path: str, sock: socket.socket) -> None:
    """Allocate an output under a mem pool of exportable memory; send its offset and size, then its descriptor."""
    lib = ctypes.CDLL(lib_path)
    lib.ca_export.restype = ctypes.c_int
    lib.ca_export.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
    allocator = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "ca_alloc", "ca_free")
    pool = torch.cuda.MemPool(allocator.allocator())
    t0 = time.perf_counter()
    with torch.cuda.use_mem_pool(pool):
        out = torch.arange(1 << 20, device="cuda", dtype=torch.float32) * 3
        small = [torch.full((i + 1,), float(i), device="cuda") for i in range(50)]  # cached blocks, reused
    torch.cuda.synchronize()
    alloc_ms = (time.perf_counter() - t0) * 1e3
    base, size = ctypes.c_uint64(), ctypes.c_uint64()
    fd = lib.ca_export(ctypes.c_void_p(out.data_ptr()), ctypes.byref(base), ctypes.byref(size))
    if fd < 0:
        send_message(sock, {"op": "pool", "error": f"ca_export returned {fd}"})
        return
    send_message(sock, {"op": "pool", "offset": out.data_ptr() - base.value, "size": size.value,
                        "alloc_ms": alloc_ms, "small_ok": bool(small[-1][0].item() == 49.0)})
    send_fds(sock, [fd])


def timer(args) -> dict:
    flags = Flags()
    order = TrustedOrder(flags)
    words = flags.buffer.tensor().view(torch.int32)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    command = [sys.executable, __file__, "--callee", str(theirs.fileno())]
    if args.pool_lib:
        command += ["--pool-lib", str(args.pool_lib)]
    box = None
    if args.sandbox:
        from cuda_agent import sandbox

        box = sandbox.Sandbox(sandbox.View(), sandbox.Limits(cpu_seconds=None))
        command = [*box.prefix(), *command]
    proc = subprocess.Popen(command, pass_fds=[theirs.fileno()])
    theirs.close()
    send_fds(ours, [flags.fd])
    ours.settimeout(120)
    ready = receive_message(ours)[0]
    finished_seen = torch.zeros(1, dtype=torch.int32, device="cuda")
    results, k = {"cycles_per_us": ready["cycles_per_us"]}, 0
    for case in args.cases:
        for work in ([0] if case == "empty" else WORK_US):
            rows: dict[str, list] = {"window_us": [], "finished_by_e1": [], "saw_this_call": []}
            for i in range(args.calls if work < 10000 else max(10, args.calls // 4)):
                k += 1
                send_message(ours, {"op": "arm", "k": k, "case": case, "work_us": work})
                receive_message(ours)
                window = order.open(k, before=lambda: write_value(order.stream, flags.address(GEN), k),
                                    after=lambda: finished_seen.copy_(words[FINISHED:FINISHED + 1]))
                window_us = window.elapsed_us(time.monotonic() + WAIT_S)
                order.stream.synchronize()
                send_message(ours, {"op": "settled?"})
                receive_message(ours)
                if i >= 5:
                    rows["window_us"].append(window_us)
                    rows["finished_by_e1"].append(int(finished_seen.item()) == k)
                    rows["saw_this_call"].append(int(words[SEEN].item()) == k)
            row = {"window_us_median": round(statistics.median(rows["window_us"]), 1),
                   "window_us_min": round(min(rows["window_us"]), 1),
                   "window_us_max": round(max(rows["window_us"]), 1),
                   "finished_by_e1": f"{sum(rows['finished_by_e1'])}/{len(rows['finished_by_e1'])}"}
            if case in ("before_go", "null_stream"):
                row["saw_this_calls_gen"] = f"{sum(rows['saw_this_call'])}/{len(rows['saw_this_call'])}"
            results[f"{case} {work}us"] = row
            print(case, work, row, flush=True)
    send_message(ours, {"op": "end"})
    results["copy_only_own_events_us"] = receive_message(ours)[0]["copy_us"]
    print("copies", results["copy_only_own_events_us"], flush=True)
    if args.pool_lib:
        reply = receive_message(ours)[0]
        if "error" not in reply:
            fd = receive_fds(ours, 1)[0]
            mapped = DeviceBuffer.open(fd, reply["size"], 0)
            got = mapped.tensor()[reply["offset"]:reply["offset"] + 4 * (1 << 20)].view(torch.float32)
            reply["values_ok"] = bool(torch.equal(got, torch.arange(1 << 20, device="cuda", dtype=torch.float32) * 3))
        results["pool"] = reply
        print("pool", reply, flush=True)
    proc.wait(timeout=60)
    if box:
        box.close()
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "sandboxed": args.sandbox,
            "calls": args.calls, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callee", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sandbox", action="store_true", help="run the callee in the candidate's sandbox")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=CASES)
    parser.add_argument("--pool-lib", type=Path, help="the exportable-memory allocator (benchmarks/exportable_pool.c)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    try:
        if args.callee is not None:
            callee(socket.socket(fileno=args.callee), str(args.pool_lib) if args.pool_lib else None)
            return
        result = timer(args)
    except OrderTimeout as exc:  # a stream still waits for a flag: leave without the driver's teardown
        print(f"TIMEOUT: {exc}", file=sys.stderr, flush=True)
        os._exit(3)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
