"""GPU timing that sees every stream: per-iteration span of all device activity recorded by the profiler.

CUDA events only measure the stream they are recorded on, so a candidate that launches its work on a side
stream would look free. Instead each timed call runs inside a named host range that ends with a device-wide
synchronise; every kernel, memcpy and memset that CUPTI records inside that range belongs to the iteration,
whatever stream or thread launched it. The iteration's device time is the span from the first activity's start
to the last one's end (launch gaps between kernels count, as they do for the user).
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
import time
from typing import Any, Callable

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
MARKER = "cuda_agent_iter_"


def measure_with_profiler(fn: Callable[[], Any], iters: int, prepare: Callable[[int], None],
                          after: Callable[[int, float], None]) -> dict[str, list]:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    host_us: list[float] = []
    marks = [time.perf_counter()]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            prepare(i)
            with record_function(f"{MARKER}{i}"):
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                host_us.append((time.perf_counter() - t0) * 1e6)
            after(i, host_us[-1])
    marks.append(time.perf_counter())  # the profiler stopped (its collection included)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        marks.append(time.perf_counter())
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
        marks.append(time.perf_counter())
    finally:
        os.unlink(path)
    device_us, kernels, outside = spans_from_trace(events, iters)
    marks.append(time.perf_counter())
    stages = [round(b - a, 4) for a, b in zip(marks, marks[1:])]
    return {"device_us": device_us, "host_us": host_us, "kernel_names": kernels, "outside_kernels": outside,
            "seconds": dict(zip(("profiled_calls", "export", "parse", "spans"), stages)), "events": len(events)}


def spans_from_trace(events: list[dict], iters: int) -> tuple[list[float], list[str], list[str]]:
    """Per-iteration device span from chrome-trace events, the distinct kernel names seen inside the iterations'
    windows, and those of kernels that ran outside every window (launched before or after a timed call)."""
    windows: dict[int, tuple[float, float]] = {}
    for ev in events:
        name = str(ev.get("name", ""))
        if ev.get("cat") == "user_annotation" and name.startswith(MARKER):
            start = float(ev["ts"])
            windows[int(name[len(MARKER):])] = (start, start + float(ev.get("dur", 0)))
    if len(windows) != iters:
        raise RuntimeError(f"profiler trace has {len(windows)} of {iters} iteration markers")
    ordered = sorted(windows.items(), key=lambda kv: kv[1][0])  # the calls ran one after another: no overlaps
    starts = [w0 for _, (w0, _) in ordered]
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    kernels: set[str] = set()
    outside: set[str] = set()
    for ev in events:
        if ev.get("cat") not in GPU_CATEGORIES or "ts" not in ev:
            continue
        start = float(ev["ts"])
        end = start + float(ev.get("dur", 0))
        k = bisect.bisect_right(starts, start) - 1  # the last window opened at or before this activity
        if k >= 0 and start <= ordered[k][1][1]:
            idx = ordered[k][0]
            first[idx] = min(first.get(idx, start), start)
            last[idx] = max(last.get(idx, end), end)
            if ev.get("cat") == "kernel":
                kernels.add(str(ev.get("name")))
        elif ev.get("cat") == "kernel":
            outside.add(str(ev.get("name")))
    spans = [last[i] - first[i] if i in first else 0.0 for i in range(iters)]
    return spans, sorted(kernels), sorted(outside)
