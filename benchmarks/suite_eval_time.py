"""How long the test suite's judge (tests/conftest.py's `fast_config`: the short timing, cpu backend) takes for one
evaluation of affine_relu's honest candidate: the first (build, torch.compile's baseline), then warm ones. Most of
CI's time is such evaluations; run it on two commits to see what a change to the judge costs the suite.

    python benchmarks/suite_eval_time.py [--evaluations 3] [--out suite_eval_time.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write

sys.path.insert(0, str(ROOT / "tests"))
from conftest import CANDIDATES, TASKS, fast_config  # noqa: E402

from cuda_agent.judge import Judge  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--evaluations", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    judge = Judge("cpu", fast_config(Path(tempfile.mkdtemp(prefix="suite-eval-time-"))))
    rows = []
    try:
        for i in range(args.evaluations):
            began = time.perf_counter()
            v = judge.evaluate(TASKS / "affine_relu.py", CANDIDATES / "affine_relu_ok")
            rows.append({"evaluation": i, "seconds": round(time.perf_counter() - began, 1), "reward": v.reward,
                         "timing_s": v.phases_s.get("timing"), "verify_s": v.phases_s.get("verify")})
    finally:
        judge.close()
    write(args.out, "the tests' judge, affine_relu's honest candidate", rows,
          ["evaluation", "seconds", "reward", "timing_s", "verify_s"], {})


if __name__ == "__main__":
    main()
