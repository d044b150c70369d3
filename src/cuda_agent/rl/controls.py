"""The recipe's controls (issue 32): what PPO's held-out gain is measured against, beside the earlier stages.

- `best_of_k`: the PPO start model's held-out episodes, k per task with k = PPO's episodes per train task, each task
  scored by its best episode: what sampling as much buys without training on it.
- `filter_finetune`: as many episodes of the PPO start model on the train tasks as PPO played, the ones the RFT
  filter keeps fine-tuned on (rejection-sampling fine-tuning): what training on its own successes buys without a
  critic or advantages.
- `expert`: the expert's kernel for each held-out task with the fast knobs and with random ones, judged once (no
  agent loop; a task it cannot fuse scores -1), and each task's better of the two: the ceiling of a kernel writer
  of these families.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from ..judge.pool import JudgePool
from .expert.formulas import Unsupported
from .expert.kernels import FAST, random_knobs, workspace_files
from .expert.trace import trace
from .scores import EpisodeRecord

CONTROLS = ("best_of_k", "filter_finetune", "expert")


def samples_per_task(steps: int, batch: int, tasks: int) -> int:
    """PPO's episodes per train task: the k of best-of-k and of filter-and-fine-tune's sampling."""
    return max(1, math.ceil(steps * batch / max(1, tasks)))


def best_of(records: list[EpisodeRecord]) -> list[EpisodeRecord]:
    """Each task's best episode (reward, then speedup over torch.compile)."""
    best: dict[str, EpisodeRecord] = {}
    for r in records:
        key = (r.reward, r.speedup_vs_compile or 0.0)
        if r.task not in best or key > (best[r.task].reward, best[r.task].speedup_vs_compile or 0.0):
            best[r.task] = r
    return list(best.values())


def expert_records(pool: JudgePool, tasks: list[Path], folder: Path, seed: int) -> dict[str, list[EpisodeRecord]]:
    """The expert's rows on `tasks`: `expert_fast`, `expert_random` and `expert_best` (per task the better)."""
    rng, jobs, rows = random.Random(seed), [], {"expert_fast": [], "expert_random": []}
    for task in tasks:
        try:
            program = trace(Path(task).read_text())
        except Unsupported as exc:
            for name in rows:
                rows[name].append(EpisodeRecord(str(task), 0, -1.0, None, 0, 0, 0, f"unsupported: {exc}", ""))
            continue
        for name, knobs in (("expert_fast", FAST), ("expert_random", random_knobs(rng))):
            workspace = Path(folder) / name / Path(task).stem
            for path, text in workspace_files(program, pool.backend.name, knobs).items():
                (workspace / path).parent.mkdir(parents=True, exist_ok=True)
                (workspace / path).write_text(text)
            jobs.append((name, task, workspace, pool.submit(task, workspace)))
    for name, task, workspace, future in jobs:
        verdict = future.result()
        rows[name].append(EpisodeRecord(str(task), 0, float(verdict.reward), verdict.speedup_vs_compile, 0, 0, 0,
                                        "judged", str(workspace)))
    rows["expert_best"] = best_of(rows["expert_fast"] + rows["expert_random"])
    return rows
