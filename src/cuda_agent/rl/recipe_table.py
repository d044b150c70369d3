"""The recipe's held-out table over arms and seeds (issue 32's `docs/data/recipe_h200.json`): `train recipe`
folders grouped by arm; per stage (base, sft, rft, ppo) each metric's mean and standard deviation over the seeds
and each seed's value, and a 95% interval from resampling tasks over every seed's episodes pooled (the seeds play
the same held-out tasks, so a task's episodes of all seeds move together); PPO against each earlier stage as a paired
difference over the same pooled tasks. Only complete evaluations count (their step's done.json)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .scores import METRICS, EpisodeRecord, paired_difference, summary

STAGES = ("base", "sft", "rft", "ppo")
EXTRA = ("geomean_speedup_vs_compile", "malformed_call_rate", "mean_turns")  # per seed only: no interval


@dataclass
class RecipeRun:
    folder: Path
    arm: str
    seed: int
    evals: dict[str, list[EpisodeRecord]] = field(default_factory=dict)  # stage -> its complete evaluation


def read_run(folder: Path) -> RecipeRun:
    """A `train recipe` folder: its arm and seed (recipe.json) and its finished held-out evaluations."""
    folder = Path(folder)
    try:
        recipe = json.loads((folder / "recipe.json").read_text())
        run = RecipeRun(folder, str(recipe["arm"]), int(recipe["seed"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{folder}: not a `train recipe` folder with a readable recipe.json ({exc})") from None
    for stage in STAGES:
        step = folder / f"eval_{stage}"
        if (step / "done.json").is_file():
            run.evals[stage] = [EpisodeRecord(**json.loads(line))
                                for line in (step / "episodes.jsonl").read_text().splitlines() if line.strip()]
    return run


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values) if values else None,
            "std": statistics.stdev(values) if len(values) > 1 else None, "seeds": values}


def _stage_row(runs: list[RecipeRun], stage: str, resamples: int) -> dict:
    per_seed = [summary(r.evals[stage], resamples, r.seed) for r in runs]
    pooled = summary([e for r in runs for e in r.evals[stage]], resamples)
    row: dict = {"seeds": [r.seed for r in runs], "tasks": pooled["tasks"], "episodes": pooled["episodes"]}
    for metric in (*METRICS, *EXTRA):
        spread = _spread([s[metric] for s in per_seed if s[metric] is not None])
        row[metric], row[f"{metric}_std"], row[f"{metric}_seeds"] = spread["mean"], spread["std"], spread["seeds"]
        if metric in METRICS:
            row[f"{metric}_ci"] = pooled[f"{metric}_ci"]
    return row


def recipe_table(runs: list[RecipeRun], resamples: int = 2000) -> dict:
    """{"arms": {ARM: {"seeds", "runs", "heldout": {STAGE: row}, "ppo_vs": {STAGE: {metric: difference}}}}}."""
    arms: dict[str, list[RecipeRun]] = {}
    for run in runs:
        group = arms.setdefault(run.arm, [])
        if any(r.seed == run.seed for r in group):
            raise ValueError(f"arm {run.arm!r} seed {run.seed} given twice ({run.folder})")
        group.append(run)
    out: dict = {"stages": list(STAGES), "arms": {}}
    for arm, group in sorted(arms.items()):
        group.sort(key=lambda r: r.seed)
        heldout = {stage: _stage_row([r for r in group if stage in r.evals], stage, resamples)
                   for stage in STAGES if any(stage in r.evals for r in group)}
        paired = [r for r in group if "ppo" in r.evals]  # the seeds PPO finished, against the same seeds' stage
        ppo_vs = {}
        for stage in STAGES[:-1]:
            both = [r for r in paired if stage in r.evals]
            if both:
                ppo = [e for r in both for e in r.evals["ppo"]]
                earlier = [e for r in both for e in r.evals[stage]]
                ppo_vs[stage] = {"seeds": [r.seed for r in both],
                                 **{m: paired_difference(ppo, earlier, m, resamples) for m in ("mean_reward",
                                                                                              "pass_rate")}}
        out["arms"][arm] = {"seeds": [r.seed for r in group], "runs": [str(r.folder) for r in group],
                            "heldout": heldout, "ppo_vs": ppo_vs}
    return out


def markdown(table: dict) -> str:
    """One row per arm and stage: mean +- std over seeds (one seed: its value) and the pooled interval."""
    def cell(row: dict, metric: str) -> str:
        mean, std = row[metric], row[f"{metric}_std"]
        shown = "-" if mean is None else f"{mean:.2f}" + (f" ± {std:.2f}" if std is not None else "")
        ci = row.get(f"{metric}_ci")
        return shown + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
    lines = ["| arm | stage | seeds | pass rate | reward >= 2 | reward 3 | mean reward | vs compile (geomean) | "
             "malformed calls | turns |", "|" + "---|" * 10]
    notes = []
    for arm, entry in table["arms"].items():
        for stage, row in entry["heldout"].items():
            speed = row["geomean_speedup_vs_compile"]
            lines.append(f"| {arm} | {stage} | {len(row['seeds'])} | {cell(row, 'pass_rate')} | "
                         f"{cell(row, 'share_2')} | {cell(row, 'share_3')} | {cell(row, 'mean_reward')} | "
                         f"{'-' if speed is None else f'{speed:.2f}x'} | {row['malformed_call_rate']:.3f} | "
                         f"{row['mean_turns']:.1f} |")
        for stage, diff in entry["ppo_vs"].items():
            parts = [f"{m.replace('_', ' ')} {d['difference']:+.2f} [{d['ci'][0]:+.2f}, {d['ci'][1]:+.2f}]"
                     for m, d in diff.items() if m != "seeds"]
            notes.append(f"- {arm}: PPO - {stage} over {len(diff['seeds'])} seed(s), paired by task: "
                         + "; ".join(parts))
    return "\n".join(lines + ([""] + notes if notes else []))
