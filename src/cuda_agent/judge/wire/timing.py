"""The timing loop shared by the baseline and candidate workers (the backend supplies clock and cache flush).

Every call, warm-up and timed alike, is prepared outside the timed region in the same order: `hooks.before`
(fresh input values written into the same buffers, so no call sees contents it has seen), the cache flush, a
synchronise, `hooks.ready`; then the timed call; then `hooks.after` (the candidate's worker checks that no thread
of the candidate is still working). Baselines and candidate go through the very same loop.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from typing import Any, Callable

from ...backend import Backend


def draw_checks(rng: random.Random, first: int, iters: int, bits: int) -> set[int]:
    """Which of the timed calls `first .. first + iters - 1` have their outputs checked: each call on its own, with
    probability 1 - 2**(-2 * bits / iters), so that a candidate wrong on half of them escapes every check with
    probability 2**-bits. A candidate can tell a checked call afterwards (the pause after it is longer), and with a
    fixed number of checks it would know when the last had passed; drawn one by one, what it saw tells it nothing
    of the calls to come."""
    if bits <= 0 or iters <= 0:
        return set()
    p = 1.0 - 2.0 ** (-2.0 * bits / iters)
    return {first + i for i in range(iters) if rng.random() < p}


class Hooks:
    """What a worker does around each call (`call` counts warm-up calls first); the default does nothing."""

    def plan(self, iters: int) -> None:
        """Called once the warm-up has fixed how many timed calls follow."""

    def before(self, call: int) -> None:
        pass

    def ready(self, call: int) -> None:
        pass

    def after(self, call: int, host_us: float) -> None:
        pass


def time_callable(fn: Callable[[], Any], backend: Backend, warmup: int, min_iters: int, max_iters: int,
                  target_time_s: float, hooks: Hooks | None = None) -> dict[str, Any]:
    hooks = hooks or Hooks()
    flush = backend.make_cache_flusher()

    def prepare(call: int) -> None:
        hooks.before(call)
        flush()
        backend.synchronize()
        hooks.ready(call)

    warmup = max(1, warmup)
    warm: list[float] = []
    for call in range(warmup):
        prepare(call)
        t0 = time.perf_counter()
        fn()
        backend.synchronize()
        warm.append(time.perf_counter() - t0)
        hooks.after(call, warm[-1] * 1e6)
    per_call = statistics.median(warm[-3:])
    iters = int(min(max_iters, max(min_iters, math.ceil(target_time_s / max(per_call, 1e-6)))))
    hooks.plan(iters)
    raw = backend.measure(fn, iters, lambda i: prepare(warmup + i), lambda i, us: hooks.after(warmup + i, us))
    return summarize(raw["device_us"], raw["host_us"], raw.get("kernel_names"), raw.get("outside_kernels"))


def spread(stats: dict[str, Any]) -> float:
    """Relative spread of a timing: (p80 - p20) / median."""
    return (stats["p80_us"] - stats["p20_us"]) / stats["median_us"] if stats["median_us"] > 0 else math.inf


def summarize(device_us: list[float], host_us: list[float], kernels: list[str] | None = None,
              outside_kernels: list[str] | None = None) -> dict[str, Any]:
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
        "outside_kernels": outside_kernels,
    }
