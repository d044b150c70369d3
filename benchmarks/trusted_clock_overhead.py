"""The trusted clock beside the in-process clock it replaces, side by side in one run (either backend).

One judge, one candidate (tests/data/candidates/affine_relu_ok, the fused C++/OpenMP kernel, on the cpu backend;
affine_relu_cuda, one fused CUDA kernel, on cuda) on the affine_relu task at several sizes; each round judges it
with the trusted clock (the reference worker times every call of a stopped-and-resumed candidate, baselines through
the same calls in the baseline callee) and with the in-process clock (the candidate's worker times itself, baselines
in the reference worker), in alternating order. The candidate's median, eager's, torch.compile's and the speedups
are reported per clock: the trusted clock's handshake is paid by baselines and candidate alike, so speedups should
agree while absolute times grow by its cost.

On the GPU each trusted row also holds the clock's parts: the calibrated window overhead, the host part of a call
(from `call` to its answer, not charged), for candidate and eager (`--policy kernelbench` runs the candidate without
the op audit, which shows what the audit costs a call).

`--call-streams legacy,torch` (cuda) compares the streams a callee's calls can run on
(`judge/wire/gpu_order.call_stream`) instead of the two clocks: one judge and cache per stream, the trusted clock
only, in rotating order, and beside the timing rows whether a candidate that fills its output with torch and launches
its kernel without a stream (`legacy_fill`) is judged correct on each.

    python3 benchmarks/trusted_clock_overhead.py [--backend cuda] [--policy strict] --rounds 3 --out overhead.json
    python3 benchmarks/trusted_clock_overhead.py --backend cuda --call-streams legacy,torch --out streams.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from cuda_agent.judge import Judge, JudgeConfig  # noqa: E402
from cuda_agent.judge.wire.gpu_order import CALL_STREAM_ENV, CALL_STREAMS  # noqa: E402

TASK = ROOT / "tests/data/tasks/affine_relu.py"
CANDIDATES = {"cpu": ROOT / "tests/data/candidates/affine_relu_ok",
              "cuda": ROOT / "tests/data/candidates/affine_relu_cuda"}
PARTS = ("clock_overhead_us", "host_us_median", "p20_us", "p80_us")  # the GPU clock's, per timed callee


def sized_task(folder: Path, log2: int) -> Path:
    path = folder / f"affine_relu_2e{log2}.py"
    path.write_text(TASK.read_text().replace("N = 1 << 21", f"N = 1 << {log2}"))
    return path


def legacy_fill(folder: Path) -> Path:
    """affine_relu's load_inline candidate with its output filled by torch and its kernel launched without a
    stream (the pattern of many public KernelBench solutions)."""
    text = (ROOT / "tests/data/candidates/affine_relu_cuda_single.py").read_text()
    for old, new in (("auto out = torch::empty_like(x);", "auto out = torch::zeros_like(x);"),
                     (", 0, c10::cuda::getCurrentCUDAStream()>>>", ">>>")):
        text = text.replace(old, new)
    path = folder / "legacy_fill.py"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="14,18,21", help="log2 of the task's element counts")
    parser.add_argument("--backend", choices=sorted(CANDIDATES), default="cpu")
    parser.add_argument("--policy", default="strict")
    parser.add_argument("--call-streams", help=f"comma-separated, of {', '.join(CALL_STREAMS)} (cuda)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="clock-overhead-"))
    if args.call_streams:
        return compare_streams(args, folder)
    judge = Judge(args.backend, JudgeConfig(cache_dir=folder / "cache", policy=args.policy))
    rows: dict[str, dict[str, list]] = {}
    try:
        for log2 in map(int, args.sizes.split(",")):
            task = sized_task(folder, log2)
            for r in range(args.rounds):
                for trusted in ((True, False) if r % 2 == 0 else (False, True)):
                    if args.backend == "cuda":
                        judge.backend.use_clock(trusted)
                    else:
                        judge.backend.trusted_clock = trusted
                    began = time.perf_counter()
                    key = f"2^{log2} {'trusted' if trusted else 'in-process'}"
                    record(rows, key, judge.evaluate(task, CANDIDATES[args.backend]), began)
    finally:
        judge.close()
    report(args, rows)


def record(rows: dict, key: str, v, began: float) -> None:
    """One verdict's times, speedups, reward and clock parts into `rows[key]`, printed."""
    row = rows.setdefault(key, {k: [] for k in ("candidate_us", "eager_us", "compile_us", "vs_eager", "vs_compile",
                                                 "reward", "seconds")})
    if not v.correct:
        print(key, "failed:", v.error, flush=True)
        return
    for name, value in (("candidate_us", v.times_us["candidate"]), ("eager_us", v.times_us["eager"]),
                        ("compile_us", v.times_us["compile"]), ("vs_eager", v.speedup_vs_eager),
                        ("vs_compile", v.speedup_vs_compile), ("reward", v.reward),
                        ("seconds", time.perf_counter() - began), *parts(v.timing)):
        row.setdefault(name, []).append(value)
    print(key, {k: round(vals[-1], 3) for k, vals in row.items()}, flush=True)


def report(args, rows: dict, extra: dict | None = None) -> None:
    summary = {key: {name: round(statistics.median(vals), 3) if vals else None for name, vals in row.items()}
               for key, row in rows.items()}
    for key, row in summary.items():
        print(f"{key:24s} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    if args.out:
        args.out.write_text(json.dumps({"rounds": args.rounds, "median": summary, "all": rows, **(extra or {})},
                                       indent=2))


def compare_streams(args, folder: Path) -> None:
    """The trusted clock with each call stream: a judge (and baseline cache) per stream; workers read the stream
    from the environment when they start, so it is set before every evaluation, and no worker starts ahead of its
    evaluation (no spare candidates: one started for the next evaluation could start under another stream)."""
    streams = args.call_streams.split(",")
    judges = {s: Judge(args.backend, JudgeConfig(cache_dir=folder / f"cache-{s}", policy=args.policy,
                                                 spare_candidates=0)) for s in streams}
    rows: dict[str, dict[str, list]] = {}
    fill: dict[str, dict] = {}
    try:
        for log2 in map(int, args.sizes.split(",")):
            task = sized_task(folder, log2)
            for r in range(args.rounds):
                for stream in streams[r % len(streams):] + streams[:r % len(streams)]:
                    os.environ[CALL_STREAM_ENV] = stream
                    began = time.perf_counter()
                    record(rows, f"2^{log2} {stream}", judges[stream].evaluate(task, CANDIDATES[args.backend]), began)
        for stream in streams:
            os.environ[CALL_STREAM_ENV] = stream
            v = judges[stream].evaluate(TASK, legacy_fill(folder))
            fill[stream] = {"correct": v.correct, "reward": v.reward, "error": v.error}
            print("legacy_fill", stream, fill[stream], flush=True)
    finally:
        for judge in judges.values():
            judge.close()
    report(args, rows, {"call_streams": streams, "legacy_fill": fill})


def parts(timing: dict) -> list[tuple[str, float]]:
    """The GPU clock's parts for the candidate and eager, where the verdict's timing holds them."""
    return [(f"{who}_{part}", timing[who][part]) for who in ("candidate", "eager")
            for part in PARTS if isinstance(timing.get(who), dict) and timing[who].get(part) is not None]


if __name__ == "__main__":
    main()
