"""GPU timing that sees every stream: per-iteration span of all device activity recorded by the profiler.

CUDA events only measure the stream they are recorded on, so a candidate that launches its work on a side
stream would look free. Instead each timed call runs inside a named host range that ends with a device-wide
synchronise; every kernel, memcpy and memset that CUPTI records inside that range belongs to the iteration,
whatever stream or thread launched it. The iteration's device time is the span from the first activity's start
to the last one's end (launch gaps between kernels count, as they do for the user).

The profiler records the call markers and CUPTI's activity, not every torch op: per-op recording costs host time
on each launch, which widens the gaps between a launch-bound model's kernels (ResNet18's span grew 1.37x under
it, docs/measurements-log.md). The events are read from the profiler's own results, with no trace file written.
Exactly one marker per call must be there: a candidate that opens ranges of the same name to shrink a call's
window is refused.
"""

from __future__ import annotations

import bisect
import time
from typing import Any, Callable

import torch
from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, RecordScope, _ExperimentalConfig
from torch.autograd import DeviceType, _disable_profiler, _enable_profiler, _prepare_profiler
from torch.autograd.profiler import record_function

GPU_ACTIVITIES = {"kernel", "gpu_memcpy", "gpu_memset"}
MARKER_KIND = "user_annotation"
MARKER = "cuda_agent_iter_"
Activity = tuple[str, str, float, float]  # (kind, name, start us, end us)
USER_SCOPE = int(RecordScope.USER_SCOPE.value)


def _profiling():
    config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())
    return config, {ProfilerActivity.CPU, ProfilerActivity.CUDA}


def start_profiler() -> None:
    """CUPTI's one-time start (seconds), done before anything is timed."""
    config, activities = _profiling()
    _prepare_profiler(config, activities)
    _enable_profiler(config, activities, {RecordScope.USER_SCOPE})
    torch.cuda.synchronize()
    _disable_profiler()


def measure_with_profiler(fn: Callable[[], Any], iters: int, prepare: Callable[[int], None],
                          after: Callable[[int, float], None]) -> dict[str, Any]:
    host_us: list[float] = []
    config, activities = _profiling()
    _prepare_profiler(config, activities)
    marks = [time.perf_counter()]
    _enable_profiler(config, activities, {RecordScope.USER_SCOPE})  # the markers: no torch op is recorded
    try:
        for i in range(iters):
            prepare(i)
            with record_function(f"{MARKER}{i}"):
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                host_us.append((time.perf_counter() - t0) * 1e6)
            after(i, host_us[-1])
    finally:
        result = _disable_profiler()
    marks.append(time.perf_counter())  # the profiler stopped (its collection included)
    found = activities_of(result.events())
    marks.append(time.perf_counter())
    device_us, kernels, outside = spans(found, iters)
    marks.append(time.perf_counter())
    stages = [round(b - a, 4) for a, b in zip(marks, marks[1:])]
    return {"device_us": device_us, "host_us": host_us, "kernel_names": kernels, "outside_kernels": outside,
            "seconds": dict(zip(("profiled_calls", "read", "spans"), stages)), "events": len(found)}


def activities_of(events) -> list[Activity]:
    """The call markers and GPU activities among the profiler's events (read with the methods every supported torch
    has: a marker is a host range of the user scope; every device event is an activity, the profiler's device-side
    copies of ranges included, which lie inside their own activities' extent)."""
    found = []
    for ev in events:
        device = ev.device_type()
        if device == DeviceType.CPU:
            if not (ev.is_user_annotation() or ev.scope() == USER_SCOPE):
                continue
            kind = MARKER_KIND
        elif device == DeviceType.CUDA:
            name = ev.name()
            kind = "gpu_memcpy" if name.startswith("Memcpy ") else \
                "gpu_memset" if name.startswith("Memset ") else "kernel"
        else:
            continue
        start = ev.start_ns() / 1e3
        found.append((kind, ev.name(), start, start + ev.duration_ns() / 1e3))
    return found


def spans(found: list[Activity], iters: int) -> tuple[list[float], list[str], list[str]]:
    """Per-iteration device span, the distinct kernel names seen inside the iterations' windows, and those of
    kernels that ran outside every window (launched before or after a timed call)."""
    windows: dict[int, tuple[float, float]] = {}
    markers = 0
    for kind, name, start, end in found:
        if kind == MARKER_KIND and name.startswith(MARKER):
            markers += 1
            suffix = name[len(MARKER):]
            if suffix.isdigit():
                windows[int(suffix)] = (start, end)
    if markers != iters or sorted(windows) != list(range(iters)):
        raise RuntimeError(f"the profiler saw {markers} call markers for {iters} timed calls: ranges named "
                           f"{MARKER}* are the timing harness's own")
    marker_names = {f"{MARKER}{i}" for i in windows}
    ordered = sorted(windows.items(), key=lambda kv: kv[1][0])  # the calls ran one after another: no overlaps
    starts = [w0 for _, (w0, _) in ordered]
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    kernels: set[str] = set()
    outside: set[str] = set()
    for kind, name, start, end in found:
        if kind not in GPU_ACTIVITIES:
            continue
        k = bisect.bisect_right(starts, start) - 1  # the last window opened at or before this activity
        if k >= 0 and start <= ordered[k][1][1]:
            idx = ordered[k][0]
            first[idx] = min(first.get(idx, start), start)
            last[idx] = max(last.get(idx, end), end)
            if kind == "kernel" and name not in marker_names:  # (the profiler's device-side copy of a marker)
                kernels.add(name)
        elif kind == "kernel":
            outside.add(name)
    device_us = [last[i] - first[i] if i in first else 0.0 for i in range(iters)]
    return device_us, sorted(kernels), sorted(outside)
