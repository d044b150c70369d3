"""Do the cuda backend's two clocks agree? Each KernelBench task's eager Model timed, side by side in one process,
by the in-process clock (CUPTI spans of all GPU activity per call, `wire/timing.py`) and by the trusted clock
(the reference worker's events around calls of the baseline callee ordered on the GPU, the clock's overhead
measured on empty calls and subtracted, `trusted/gpu_calls.py`). Same inputs' distribution, fresh values and an L2
flush before every call on both. Writes one row per task and prints the ratio new/old.

    python3 benchmarks/gpu_clock_agreement.py --kernelbench KB [--tasks 24] [--out agreement.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuda_agent.judge.candidate import output_pool  # noqa: E402
from cuda_agent.judge.trusted.reference_worker import Reference  # noqa: E402

TIMING = {"warmup": 5, "min_iters": 20, "max_iters": 100, "target_time_s": 0.3}


def tasks(root: Path, count: int) -> list[Path]:
    """`count` tasks spread over levels 1 and 2 (every k-th file of each, in name order)."""
    files = [sorted((root / level).glob("*.py")) for level in ("level1", "level2")]
    picked = []
    for level in files:
        step = max(1, len(level) // max(1, count // 2))
        picked += level[::step][: count // 2 + count % 2]
    return picked[:count]


def measure(task: Path, library: str) -> dict:
    req = {"task_path": str(task), "backend": "cuda", "allow_tf32": False, "compile_mode": "default",
           "init_seed": 1, "output_pool": library, "scaled_inputs": False}
    ref = Reference(req)
    try:
        old = ref._timed(lambda inputs: ref.model(*inputs), TIMING)
        calls = ref.baseline_calls()
        new = ref.time_calls(calls, TIMING, time.monotonic() + 300, "eager")
    finally:
        if ref.baseline_process is not None:
            ref.baseline_process.kill()
    return {"task": f"{task.parent.name}/{task.name}", "old_us": old["median_us"], "new_us": new["median_us"],
            "ratio": new["median_us"] / old["median_us"] if old["median_us"] else None,
            "clock_overhead_us": new["clock_overhead_us"], "host_us_median": new["host_us_median"],
            "old_p20_p80_us": [old["p20_us"], old["p80_us"]], "new_p20_p80_us": [new["p20_us"], new["p80_us"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernelbench", type=Path, required=True)
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    library = str(output_pool.build(Path(tempfile.mkdtemp(prefix="output-pool-"))))
    rows = []
    for task in tasks(args.kernelbench, args.tasks):
        try:
            row = measure(task, library)
        except Exception as exc:  # a task that cannot run here is reported, not fatal
            row = {"task": f"{task.parent.name}/{task.name}", "error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            args.out.write_text(json.dumps({"rows": rows}, indent=1))
    long = [r["ratio"] for r in rows if r.get("ratio") and r["old_us"] >= 100]
    summary = {"tasks": len(rows), "failed": sum("error" in r for r in rows), "tasks_over_100us": len(long),
               "median_ratio_over_100us": statistics.median(long) if long else None,
               "within_3pct_over_100us": sum(abs(r - 1) <= 0.03 for r in long)}
    print(json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
