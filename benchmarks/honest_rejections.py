"""How often the judge rejects honest kernels: the learning demo's correct picks (rl/demo_task), each judged many
times at once on the JudgePool (the load of an RL step), counting every verdict that is not correct.

    python benchmarks/honest_rejections.py --backend cuda --repeats 8 --gpus 0,1 --out honest.json
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

from _common import write

from cuda_agent.judge import JudgeConfig
from cuda_agent.judge.pool import JudgePool
from cuda_agent.rl.demo import TASK_DIR, candidate_files
from cuda_agent.workspace.build import TEMPLATE_DIR

PICKS = {"cuda": ["A3", "B3", "D2", "D3", "A1", "B4"], "cpu": ["A", "B", "D"]}


def workspace(folder: Path, backend: str, pick: str) -> Path:
    for path, content in candidate_files(backend, list(pick)).items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(content)
    for name in ("binding.cpp", "binding_registry.h"):
        (folder / name).write_text((TEMPLATE_DIR / name).read_text())
    return folder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda", choices=sorted(PICKS))
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--gpus", default=None)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    reference = Path(str(TASK_DIR.joinpath("affine_relu.py")))
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    with tempfile.TemporaryDirectory() as tmp:
        work = [(pick, workspace(Path(tmp) / f"{pick}-{i}", args.backend, pick))
                for pick in PICKS[args.backend] for i in range(args.repeats)]
        began = time.monotonic()
        with JudgePool(args.backend, JudgeConfig(cache_dir=Path(tmp) / "cache"), devices=gpus) as pool:
            futures = [(pick, pool.submit(reference, ws)) for pick, ws in work]
            verdicts = [(pick, f.result()) for pick, f in futures]
        seconds = time.monotonic() - began
    rows, reasons = [], collections.Counter()
    for pick in PICKS[args.backend]:
        mine = [v for p, v in verdicts if p == pick]
        failed = [v for v in mine if not v.correct]
        reasons.update((v.error or "")[:60] for v in failed)
        rows.append({"pick": pick, "judged": len(mine), "rejected": len(failed),
                     "rewards": " ".join(str(v.reward) for v in mine)})
        for v in failed:
            print(pick, v.error)
    total = sum(r["rejected"] for r in rows)
    print(f"{total} of {len(verdicts)} honest verdicts rejected in {seconds:.0f}s")
    write(args.out, "Honest kernels rejected under load", rows, ["pick", "judged", "rejected", "rewards"],
          {"seconds": seconds, "rejected": total, "judged": len(verdicts), "reasons": dict(reasons)})


if __name__ == "__main__":
    main()
