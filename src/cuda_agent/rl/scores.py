"""A held-out evaluation's numbers: per-episode records summarised per task, then over tasks, with confidence
intervals from a bootstrap over tasks (episodes of one task are not independent), and paired differences between
two evaluations of the same tasks (same tasks resampled together: the usual way to compare checkpoints)."""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

METRICS = ("pass_rate", "share_2", "share_3", "mean_reward")  # the ones with intervals


@dataclass
class EpisodeRecord:
    task: str
    sample: int
    reward: float
    speedup_vs_compile: float | None
    turns: int
    model_turns: int
    malformed: int  # tool calls answered "could not be read" or "bad arguments"
    stop: str
    run_dir: str


def task_name(task: str) -> str:
    """A task as two evaluations of it agree on: its file and folder names (an export's tasks are written into each
    run folder anew, so two runs' paths differ: `.../run-a/tasks/held/row3.py` is `held/row3.py`)."""
    return "/".join(Path(task).parts[-2:])


def per_task(records: list[EpisodeRecord]) -> dict[str, dict[str, float]]:
    """Each task's means over its episodes."""
    tasks: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        tasks[task_name(r.task)].append(r)
    return {task: {"pass_rate": statistics.fmean(r.reward >= 1 for r in rs),
                   "share_2": statistics.fmean(r.reward >= 2 for r in rs),
                   "share_3": statistics.fmean(r.reward >= 3 for r in rs),
                   "mean_reward": statistics.fmean(r.reward for r in rs)} for task, rs in sorted(tasks.items())}


def _interval(values: list[float], resamples: int, rng: random.Random) -> list[float]:
    """The 95% percentile interval of the mean of `values` resampled with replacement."""
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return [means[int(0.025 * (resamples - 1))], means[int(0.975 * (resamples - 1))]]


def summary(records: list[EpisodeRecord], resamples: int = 2000, seed: int = 0) -> dict:
    """The evaluation's table row: means over tasks with 95% intervals, and the episode-level rates."""
    if not records:
        raise ValueError("no episodes to summarise")
    tasks = per_task(records)
    rng = random.Random(seed)
    out: dict = {"tasks": len(tasks), "episodes": len(records)}
    for metric in METRICS:
        values = [t[metric] for t in tasks.values()]
        out[metric] = statistics.fmean(values)
        out[f"{metric}_ci"] = _interval(values, resamples, rng)
    passing = [r.speedup_vs_compile for r in records if r.reward >= 1 and r.speedup_vs_compile]
    out["geomean_speedup_vs_compile"] = math.exp(statistics.fmean(map(math.log, passing))) if passing else None
    turns = sum(r.model_turns for r in records)
    out["malformed_call_rate"] = sum(r.malformed for r in records) / turns if turns else 0.0
    out["mean_turns"] = statistics.fmean(r.turns for r in records)
    return out


def paired_difference(after: list[EpisodeRecord], before: list[EpisodeRecord], metric: str = "mean_reward",
                      resamples: int = 2000, seed: int = 0) -> dict:
    """after - before on the tasks both evaluated, with a 95% interval from resampling those tasks together."""
    a, b = per_task(after), per_task(before)
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("the two evaluations share no task")
    diffs = [a[t][metric] - b[t][metric] for t in common]
    return {"metric": metric, "tasks": len(common), "difference": statistics.fmean(diffs),
            "ci": _interval(diffs, resamples, random.Random(seed))}
