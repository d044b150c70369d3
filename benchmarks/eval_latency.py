"""End-to-end latency of one judge evaluation: cold (nothing cached), warm (baselines and objects cached),
after editing one kernel; optionally real KernelBench problems with the solutions in benchmarks/solutions.

    python benchmarks/eval_latency.py --backend cuda --out eval_latency.json [--kernelbench DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from _common import ROOT, write

from cuda_agent.judge import Judge, JudgeConfig

CASES = {"cuda": ("affine_relu_cuda", "kernels/affine_relu.cu"), "cpu": ("affine_relu_ok", "kernels/affine_relu.cpp")}
TASK = ROOT / "tests" / "data" / "tasks" / "affine_relu.py"
SOLUTIONS = ROOT / "benchmarks" / "solutions"


def row(step: str, v) -> dict:
    return {"step": step, "seconds": v.seconds, "build_s": v.build.get("seconds"), "reward": v.reward,
            "eager_us": v.times_us["eager"], "compile_us": v.times_us["compile"],
            "candidate_us": v.times_us["candidate"], "error": v.error or "",
            "phases": " ".join(f"{k}={t:.1f}" for k, t in v.phases_s.items())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda", choices=sorted(CASES))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--kernelbench", type=Path, help="KernelBench problems folder (with level1/ ...)")
    ap.add_argument("--pause", type=float, default=15.0, help="seconds between two evaluations (a model's turn)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eval-latency-"))
    workspace, kernel = CASES[args.backend]
    ws = tmp / "ws"
    shutil.copytree(ROOT / "tests" / "data" / "candidates" / workspace, ws)
    judge = Judge(args.backend, JudgeConfig(cache_dir=tmp / "cache"))
    rows = [row("cold: empty cache (header, objects, baselines incl. torch.compile)", judge.evaluate(TASK, ws)),
            row("warm: same candidate again", judge.evaluate(TASK, ws))]
    (ws / kernel).write_text((ws / kernel).read_text() + "\n// edited\n")
    rows.append(row(f"after editing {kernel}", judge.evaluate(TASK, ws)))
    judge.close()
    # Side by side: the same warm evaluation without and with a spare candidate worker started ahead (the pause
    # stands for the model's turn between two verifications).
    for spares in (0, 2):
        with Judge(args.backend, JudgeConfig(cache_dir=tmp / "cache", spare_candidates=spares)) as again:
            again.evaluate(TASK, ws)  # its reference worker warms up
            time.sleep(args.pause)
            rows.append(row(f"warm reference, spare_candidates={spares}, after a {args.pause:.0f} s pause",
                            again.evaluate(TASK, ws)))
    if args.kernelbench:
        with Judge(args.backend, JudgeConfig(cache_dir=tmp / "cache")) as judge:
            for solution in sorted(SOLUTIONS.glob("level*/*")):
                task = args.kernelbench / solution.parent.name / (solution.stem + ".py")
                for attempt in ("cold", "warm"):
                    rows.append(row(f"KernelBench {solution.parent.name}/{task.name} ({attempt})",
                                    judge.evaluate(task, solution)))
    write(args.out, f"Evaluation latency ({args.backend})", rows,
          ["step", "seconds", "build_s", "reward", "eager_us", "compile_us", "candidate_us", "phases", "error"],
          {"backend": args.backend})
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
