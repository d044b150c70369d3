"""The timing loop shared by the baseline and candidate workers (the backend supplies clock and cache flush)."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

from ..backend import Backend


def time_callable(fn: Callable[[], Any], backend: Backend, warmup: int, min_iters: int, max_iters: int,
                  target_time_s: float) -> dict[str, Any]:
    flush = backend.make_cache_flusher()
    warm: list[float] = []
    for _ in range(max(1, warmup)):
        flush()
        backend.synchronize()
        t0 = time.perf_counter()
        fn()
        backend.synchronize()
        warm.append(time.perf_counter() - t0)
    per_call = statistics.median(warm[-3:])
    iters = int(min(max_iters, max(min_iters, math.ceil(target_time_s / max(per_call, 1e-6)))))
    raw = backend.measure(fn, iters, flush)
    return summarize(raw["device_us"], raw["host_us"], raw.get("kernel_names"))


def summarize(device_us: list[float], host_us: list[float], kernels: list[str] | None = None) -> dict[str, Any]:
    ordered = sorted(device_us)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return {
        "median_us": statistics.median(device_us),
        "mean_us": statistics.fmean(device_us),
        "std_us": statistics.pstdev(device_us),
        "min_us": ordered[0],
        "max_us": ordered[-1],
        "p20_us": pct(0.2),
        "p80_us": pct(0.8),
        "iters": len(device_us),
        "host_median_us": statistics.median(host_us),
        "kernels": kernels,
    }
