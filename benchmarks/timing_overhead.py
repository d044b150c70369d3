"""Where a timed run's seconds go besides the calls themselves, and what the profiler does to the times it reports.

Verification and timing hold a GPU exclusively, so every second of a timed run that is not a timed call (stopping
the profiler, exporting and parsing its trace, finding each call's device span) is device time the pool cannot
give to another evaluation. Per task (a KernelBench reference's `Model`, eager, as the judge times baselines):
the profiled run's stages in seconds, the trace's size, and the per-call device time the profiler reports beside
CUDA events around the same calls without a profiler (its host overhead widens launch gaps, which the profiled
span counts), the busy time inside each call (GPU activity with overlaps merged: no gaps), and the span when the
profiler records CUDA activity only, if its call markers survive that. `--synthetic` times only the span search
on made-up traces (any machine, no GPU).

    python benchmarks/timing_overhead.py --kernelbench DIR --out timing_overhead.json   # on a GPU
    python benchmarks/timing_overhead.py --synthetic
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

from _common import write

from cuda_agent.gpu_timing import MARKER, spans_from_trace

TASKS = ("level1/19_ReLU.py,level1/23_Softmax.py,level1/1_Square_matrix_multiplication_.py,"
         "level2/12_Gemm_Multiply_LeakyReLU.py,level2/52_Conv2d_Activation_BatchNorm.py,level3/9_ResNet18.py,"
         "level3/38_LSTMBidirectional.py")


def synthetic_trace(iters: int, per_call: int) -> list[dict]:
    """A trace shaped like the judge's: per call a window with `per_call` kernels inside and a flush and an input
    fill outside it."""
    events = []
    for i in range(iters):
        t0 = 1000.0 * i
        events += [{"cat": "kernel", "name": "flush", "ts": t0, "dur": 5.0},
                   {"cat": "kernel", "name": "fill", "ts": t0 + 10, "dur": 5.0},
                   {"cat": "user_annotation", "name": f"{MARKER}{i}", "ts": t0 + 100, "dur": 800.0}]
        events += [{"cat": "kernel", "name": f"k{j % 7}", "ts": t0 + 110 + 700 * j / per_call, "dur": 1.0}
                   for j in range(per_call)]
    return events


def synthetic_rows() -> list[dict]:
    rows = []
    for iters, per_call in ((10, 10), (100, 10), (100, 100), (100, 1000)):
        events = synthetic_trace(iters, per_call)
        start = time.perf_counter()
        spans_from_trace(events, iters)
        rows.append({"task": f"synthetic {iters} calls x {per_call} kernels", "iters": iters, "events": len(events),
                     "spans_s": round(time.perf_counter() - start, 4)})
    return rows


def trace(fn, iters: int, prepare, cuda_only: bool) -> list[dict]:
    """The chrome-trace events of `iters` marked calls, profiling CPU and CUDA activity (as the judge does) or
    CUDA activity only (no per-op host overhead; the question is whether the call markers survive)."""
    import json
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CUDA] if cuda_only else [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        for i in range(iters):
            prepare(i)
            with record_function(f"{MARKER}{i}"):
                fn()
                torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return json.loads(Path(f.name).read_text()).get("traceEvents", [])


def busy_us(events: list[dict]) -> list[float]:
    """Per marked call, the time some GPU activity was running (overlaps merged; launch gaps not counted)."""
    windows = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                     if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(MARKER))
    busy = []
    for w0, w1 in windows:
        spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                       if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and w0 <= float(e["ts"]) <= w1)
        total, end = 0.0, -math.inf
        for a, b in spans:
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        busy.append(total)
    return busy


def task_row(path: Path, target_time_s: float) -> dict:
    """One task's Model timed as the judge times a baseline (calls chosen for `target_time_s`, L2 flushed before
    each), once under the profiler and once with CUDA events only."""
    import torch

    from cuda_agent.backend import get_backend
    from cuda_agent.task import import_file

    cuda = get_backend("cuda")
    module = import_file(path, f"task_{path.stem}")
    model = module.Model(*module.get_init_inputs()).cuda().eval()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
    flush = cuda.make_cache_flusher()

    def fn():
        with torch.no_grad():
            return model(*inputs)

    def prepare(_: int) -> None:
        flush()
        torch.cuda.synchronize()

    for _ in range(3):
        prepare(0)
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        per_call = time.perf_counter() - start
    iters = int(min(100, max(10, math.ceil(target_time_s / max(per_call, 1e-6)))))
    start = time.perf_counter()
    raw = cuda.measure(fn, iters, prepare, lambda i, us: None)
    total = time.perf_counter() - start
    events_us = []
    for _ in range(iters):
        prepare(0)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        events_us.append(begin.elapsed_time(end) * 1000)
    profiled, plain = statistics.median(raw["device_us"]), statistics.median(events_us)
    busy = statistics.median(busy_us(trace(fn, iters, prepare, cuda_only=False)))
    cuda_only = trace(fn, iters, prepare, cuda_only=True)
    marked = [e.get("cat") for e in cuda_only if str(e.get("name", "")).startswith(MARKER)]
    markers, gpu_markers = marked.count("user_annotation"), marked.count("gpu_user_annotation")
    only = statistics.median(spans_from_trace(cuda_only, iters)[0]) if markers == iters else None
    del model, inputs
    torch.cuda.empty_cache()
    return {"task": f"{path.parent.name}/{path.stem}", "iters": iters, "events": raw["events"],
            "kernels_per_call": len(raw["kernel_names"]), "run_s": round(total, 3),
            **{f"{k}_s": v for k, v in raw["seconds"].items()},
            "profiled_us": round(profiled, 1), "cuda_events_us": round(plain, 1),
            "profiled_vs_events": round(profiled / plain, 3) if plain else None, "busy_us": round(busy, 1),
            "cuda_only_markers": markers, "cuda_only_gpu_markers": gpu_markers,
            "cuda_only_span_us": None if only is None else round(only, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernelbench", type=Path, help="KernelBench problems folder (level1/ ...)")
    ap.add_argument("--tasks", default=TASKS, help="comma-separated task files under --kernelbench")
    ap.add_argument("--target-time", type=float, default=0.3, help="seconds of timed calls (JudgeConfig's default)")
    ap.add_argument("--synthetic", action="store_true", help="only the span search on made-up traces (no GPU)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = synthetic_rows()
    if not args.synthetic:
        trace(lambda: None, 1, lambda i: None, cuda_only=False)  # CUPTI starts once per process (~4 s), not per task
        if args.kernelbench is None:
            ap.error("--kernelbench DIR is needed (or --synthetic)")
        for name in filter(None, args.tasks.split(",")):
            rows.append(task_row(args.kernelbench / name, args.target_time))
            print(rows[-1], flush=True)
    write(args.out, "Timing overhead", rows,
          ["task", "iters", "events", "kernels_per_call", "run_s", "profiled_calls_s", "export_s", "parse_s",
           "spans_s", "profiled_us", "cuda_events_us", "profiled_vs_events", "busy_us", "cuda_only_markers",
           "cuda_only_gpu_markers", "cuda_only_span_us"], {"target_time_s": args.target_time})


if __name__ == "__main__":
    main()
