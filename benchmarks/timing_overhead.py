"""Where a timed run's seconds go besides the calls themselves, and what the profiler does to the times it reports.

Verification and timing hold a GPU exclusively, so every second of a timed run that is not a timed call (stopping
the profiler, reading its events, finding each call's device span) is device time the pool cannot give to another
evaluation. Per task (a KernelBench reference's `Model`, eager, as the judge times baselines), side by side in one
process: the judge's timed run (`measure_with_profiler`: call markers and CUPTI activity, events read in memory),
its stages in seconds and its per-call device time; the same calls under the profiler as the judge ran it before
(every torch op recorded, the trace exported as JSON and parsed); and CUDA events around the same calls with no
profiler. A profiler's host overhead widens a launch-bound model's launch gaps, which the span counts: the ratios
to CUDA events show how much. `--synthetic` times only the span search on made-up traces (any machine, no GPU).

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

from cuda_agent.gpu_timing import MARKER, spans

TASKS = ("level1/19_ReLU.py,level1/23_Softmax.py,level1/1_Square_matrix_multiplication_.py,"
         "level2/12_Gemm_Multiply_LeakyReLU.py,level2/52_Conv2d_Activation_BatchNorm.py,level3/9_ResNet18.py,"
         "level3/38_LSTMBidirectional.py")


def synthetic_trace(iters: int, per_call: int) -> list[tuple]:
    """Activities shaped like a timed run's: per call a window with `per_call` kernels inside and a flush and an
    input fill outside it."""
    found = []
    for i in range(iters):
        t0 = 1000.0 * i
        found += [("kernel", "flush", t0, t0 + 5), ("kernel", "fill", t0 + 10, t0 + 15),
                  ("user_annotation", f"{MARKER}{i}", t0 + 100, t0 + 900)]
        found += [("kernel", f"k{j % 7}", t0 + 110 + 700 * j / per_call, t0 + 111 + 700 * j / per_call)
                  for j in range(per_call)]
    return found


def synthetic_rows() -> list[dict]:
    rows = []
    for iters, per_call in ((10, 10), (100, 10), (100, 100), (100, 1000)):
        found = synthetic_trace(iters, per_call)
        start = time.perf_counter()
        spans(found, iters)
        rows.append({"task": f"synthetic {iters} calls x {per_call} kernels", "iters": iters, "events": len(found),
                     "spans_s": round(time.perf_counter() - start, 4)})
    return rows


def full_trace_run(fn, iters: int, prepare) -> tuple[float, float, int]:
    """The calls timed as the judge did before this tree: every torch op recorded beside CUDA activity, the trace
    exported as JSON and parsed. Returns (seconds, median device us per call, trace events)."""
    import json
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            prepare(i)
            with record_function(f"{MARKER}{i}"):
                fn()
                torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text()).get("traceEvents", [])
    found = [(str(e.get("cat")), str(e.get("name", "")), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
             for e in events if "ts" in e]
    device_us = spans(found, iters)[0]
    return time.perf_counter() - start, statistics.median(device_us), len(events)


def task_row(path: Path, target_time_s: float, rounds: int) -> dict:
    """One task's Model timed as the judge times a baseline (calls chosen for `target_time_s`, L2 flushed before
    each): by the judge's timed run, by CUDA events with no profiler and under the former full trace, in turn for
    `rounds` rounds (medians over the rounds)."""
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
            return model(*inputs)  # noqa: F821 (ruff 0.17: bound above)

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
    judged, plain, full = [], [], []  # per round: (seconds, median us[, events])
    for _ in range(rounds):  # the three ways in turn, so that a drift of the machine touches each alike
        start = time.perf_counter()
        raw = cuda.measure(fn, iters, prepare, lambda i, us: None)
        judged.append((time.perf_counter() - start, statistics.median(raw["device_us"]), raw))
        plain.append(cuda_events_us(fn, iters, prepare))
        full.append(full_trace_run(fn, iters, prepare))
    del model, inputs
    torch.cuda.empty_cache()
    raw = judged[-1][2]
    profiled = statistics.median(r[1] for r in judged)
    events_us = statistics.median(plain)
    full_us = statistics.median(r[1] for r in full)
    return {"task": f"{path.parent.name}/{path.stem}", "iters": iters, "rounds": rounds, "events": raw["events"],
            "kernels_per_call": len(raw["kernel_names"]), "run_s": round(statistics.median(r[0] for r in judged), 3),
            **{f"{k}_s": v for k, v in raw["seconds"].items()}, "profiled_us": round(profiled, 1),
            "full_trace_events": full[-1][2], "full_trace_run_s": round(statistics.median(r[0] for r in full), 3),
            "full_trace_us": round(full_us, 1), "cuda_events_us": round(events_us, 1),
            "profiled_vs_events": round(profiled / events_us, 3) if events_us else None,
            "full_trace_vs_events": round(full_us / events_us, 3) if events_us else None,
            "rounds_us": {"judge": [round(r[1], 1) for r in judged], "cuda_events": [round(u, 1) for u in plain],
                          "full_trace": [round(r[1], 1) for r in full]}}


def cuda_events_us(fn, iters: int, prepare) -> float:
    """Median of CUDA events around each call, no profiler."""
    import torch

    times = []
    for _ in range(iters):
        prepare(0)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernelbench", type=Path, help="KernelBench problems folder (level1/ ...)")
    ap.add_argument("--tasks", default=TASKS, help="comma-separated task files under --kernelbench")
    ap.add_argument("--target-time", type=float, default=0.3, help="seconds of timed calls (JudgeConfig's default)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three timings, in turn")
    ap.add_argument("--synthetic", action="store_true", help="only the span search on made-up traces (no GPU)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = synthetic_rows()
    if not args.synthetic:
        if args.kernelbench is None:
            ap.error("--kernelbench DIR is needed (or --synthetic)")
        from cuda_agent.gpu_timing import start_profiler

        start = time.perf_counter()
        start_profiler()  # CUPTI starts once per process, as the judge's workers do before any timed run
        rows.append({"task": "the profiler's first start in this process",
                     "run_s": round(time.perf_counter() - start, 3)})
        for name in filter(None, args.tasks.split(",")):
            rows.append(task_row(args.kernelbench / name, args.target_time, args.rounds))
            print(rows[-1], flush=True)
    write(args.out, "Timing overhead", rows,
          ["task", "iters", "rounds", "events", "kernels_per_call", "run_s", "profiled_calls_s", "read_s", "spans_s",
           "profiled_us", "full_trace_events", "full_trace_run_s", "full_trace_us", "cuda_events_us",
           "profiled_vs_events", "full_trace_vs_events"], {"target_time_s": args.target_time})


if __name__ == "__main__":
    main()
