"""The recipe's page (`train recipe` folders, one per seed): the held-out table of every stage and control, mean
and spread over the seeds, and PPO's stability signals per step with a band from the lowest to the highest seed."""

from __future__ import annotations

import math
import statistics
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .page import esc, figure, number, table, text

SIGNALS = {  # PPO's per-step metrics drawn, with their titles
    "reward_mean": "mean reward (train tasks)", "pass_rate": "pass rate (train tasks)", "entropy": "actor entropy",
    "explained_variance": "critic explained variance", "clip_fraction": "clip fraction",
    "approx_kl": "approx. KL to the sampler", "response_tokens_mean": "response tokens per episode",
    "cut_share": "replies cut at the length limit", "rollout_logp_gap": "sampler vs trainer log-prob gap",
    "policy_violations": "episodes with a policy violation"}
COLUMNS = [("pass_rate", "pass rate"), ("share_2", "reward >= 2"), ("share_3", "reward 3"),
           ("mean_reward", "mean reward")]


def _spread(values: list[float]) -> str:
    """One seed: its value; several: mean +- std (n)."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f} (n={len(values)})"


def recipe_rows(runs: list[dict]) -> list[dict[str, Any]]:
    """One row per stage and control of the held-out table: each metric's mean over seeds, its seeds' values, and
    with one seed its bootstrap interval."""
    rows = []
    for group in ("heldout", "controls"):
        names = list(dict.fromkeys(n for r in runs for n in (r["recipe"].get(group) or {})))
        for name in names:
            found = [r["recipe"][group][name] for r in runs if name in (r["recipe"].get(group) or {})]
            row: dict[str, Any] = {"row": name, "kind": "stage" if group == "heldout" else "control",
                                   "seeds": len(found)}
            for key, _ in COLUMNS:
                values = [f[key] for f in found if f.get(key) is not None]
                row[key] = statistics.fmean(values) if values else None
                row[f"{key}_seeds"] = values
                row[f"{key}_ci"] = found[0].get(f"{key}_ci") if len(found) == 1 else None
            speeds = [f["geomean_speedup_vs_compile"] for f in found if f.get("geomean_speedup_vs_compile")]
            row["geomean_speedup_vs_compile"] = statistics.fmean(speeds) if speeds else None
            rows.append(row)
    return rows


def _signals(runs: list[dict]) -> str:
    keys = [k for k in SIGNALS if any(k in s for r in runs for s in r["steps"])]
    if not keys:
        return "<p>No PPO metrics (the recipe has not reached PPO).</p>"
    cols = 2
    fig = make_subplots(rows=math.ceil(len(keys) / cols), cols=cols, subplot_titles=[SIGNALS[k] for k in keys])
    for i, key in enumerate(keys):
        at = dict(row=i // cols + 1, col=i % cols + 1)
        per_step: dict[int, list[float]] = {}
        for r in runs:
            for s in r["steps"]:
                if isinstance(s.get(key), (int, float)) and math.isfinite(s[key]):
                    per_step.setdefault(s["step"], []).append(float(s[key]))
        steps = sorted(per_step)
        if len(runs) > 1:  # the band: lowest to highest seed at each step
            fig.add_trace(go.Scatter(x=steps + steps[::-1], y=[max(per_step[t]) for t in steps] +
                                     [min(per_step[t]) for t in steps[::-1]], fill="toself", line_width=0, mode="lines",
                                     fillcolor="rgba(31,119,180,0.2)", showlegend=False, hoverinfo="skip"), **at)
        fig.add_trace(go.Scatter(x=steps, y=[statistics.fmean(per_step[t]) for t in steps], mode="lines+markers",
                                 showlegend=False, name=key), **at)
    fig.update_xaxes(title_text="PPO step")
    fig.update_layout(height=240 * math.ceil(len(keys) / cols), margin=dict(t=40, b=40, l=60, r=20))
    return figure(fig)


def recipe_view(runs: list[dict]):
    rows = recipe_rows(runs)
    arms = sorted({r["recipe"]["arm"] for r in runs})
    seeds = [r["recipe"].get("seed") for r in runs]
    stopped = [f"{r['source']}: {r['recipe']['stopped']}" for r in runs if r["recipe"].get("stopped")]

    def cell(row: dict, key: str):
        ci = row[f"{key}_ci"]
        shown = _spread(row[f"{key}_seeds"]) if row[f"{key}_seeds"] else "-"
        return text(shown + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""), css="num")

    held = table(["row", "kind", "seeds", *(title for _, title in COLUMNS), "speedup vs compile (geomean)"],
                 [[text(r["row"]), text(r["kind"]), number(r["seeds"], "d"), *(cell(r, k) for k, _ in COLUMNS),
                   number(r["geomean_speedup_vs_compile"], ".2f", "x")] for r in rows])
    meta = (f"arm {esc(', '.join(arms))} &middot; seeds {esc(', '.join(map(str, seeds)))} &middot; "
            f"{len(runs)} run(s)" + "".join(f"<br>stopped: {esc(s)}" for s in stopped))
    note = ("<p>One seed: its value and 95% bootstrap interval over tasks; several: mean ± std over seeds. Controls: "
            "best-of-k and filter-and-fine-tune start where PPO started; expert rows are its kernels judged once.</p>")
    sections = [("Held-out tasks", note + held), ("PPO's stability signals", _signals(runs))]
    return f"Recipe: {', '.join(arms)}", meta, sections, rows
