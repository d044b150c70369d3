"""Where a recipe run's episodes spent their time (issue 32: one seed of one arm should fit in 25 minutes): per step
of the run folder, each episode's timeline read from its trajectory, split into the model's turns (waiting for the
batch sampler), the judge's verdicts during the episode (verify or profile: the wait, and the seconds the verdict
itself counted, the rest being the pool's queue) and the final re-judging of the best snapshot (`result`); the
step's longest episode is what the step waits for. Reads any run folder, e.g. a run.tar.gz unpacked:

    python3 benchmarks/recipe_time.py RUN_DIR [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from _common import write


def timeline(path: Path) -> dict:
    """One episode's seconds: model, judge (wall of the verdicts it waited for), judged (their own `seconds`),
    verdicts, final (the re-judging after `finish`), other tools, wall."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = {"model": 0.0, "judge": 0.0, "judged": 0.0, "verdicts": 0, "final": 0.0, "tools": 0.0, "wall": 0.0}
    last = 0.0
    for row in rows:
        t = row.get("t")
        if t is None:
            continue
        spent, last = max(t - last, 0.0), max(t, last)
        kind = row.get("type")
        if kind == "assistant":
            out["model"] += spent
        elif kind == "tool" and row.get("verdict") and spent > 0.05:  # (a verdict read again: no wait)
            out["judge"] += spent
            out["judged"] += float(row["verdict"].get("seconds") or 0.0)
            out["verdicts"] += 1
        elif kind == "tool":
            out["tools"] += spent
        elif kind == "result":
            out["final"] += spent
    out["wall"] = last
    return out


def step_rows(run: Path) -> list[dict]:
    rows = []
    for step in sorted(p for p in run.iterdir() if (p / "episodes").is_dir()):
        episodes = [timeline(t) for t in sorted((step / "episodes").rglob("trajectory.jsonl"))]
        if not episodes:
            continue
        total = {k: sum(e[k] for e in episodes) for k in episodes[0]}
        wall = total["wall"] or 1.0
        longest = max(episodes, key=lambda e: e["wall"])
        rows.append({
            "step": step.name, "episodes": len(episodes),
            "episode_s_median": round(statistics.median(e["wall"] for e in episodes), 1),
            "episode_s_max": round(longest["wall"], 1),
            "model_share": round(total["model"] / wall, 2), "judge_share": round(total["judge"] / wall, 2),
            "final_share": round(total["final"] / wall, 2), "tools_share": round(total["tools"] / wall, 2),
            "verdict_wait_s": round(total["judge"] / max(total["verdicts"], 1), 1),
            "verdict_counted_s": round(total["judged"] / max(total["verdicts"], 1), 1),
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a recipe run folder (its steps' episodes/ below it)")
    parser.add_argument("--out", type=Path, help="the rows as JSON (and the table beside it as .md)")
    args = parser.parse_args()
    if not args.run.is_dir():
        parser.error(f"{args.run} is not a folder")
    rows = step_rows(args.run)
    if not rows:
        parser.error(f"{args.run} holds no step with episodes/ (a recipe run folder, e.g. run.tar.gz unpacked)")
    columns = ["step", "episodes", "episode_s_median", "episode_s_max", "model_share", "judge_share", "final_share",
               "tools_share", "verdict_wait_s", "verdict_counted_s"]
    write(args.out, f"Where the episodes of {args.run} spent their time", rows, columns, {"run": str(args.run)})


if __name__ == "__main__":
    main()
