"""The three views (suite, agent run, training) and the side-by-side suite comparison. Each returns the page's
title, a line about the input, its sections (name, HTML) and the rows written beside the page as CSV."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..agent.summary import EpisodeSummary
from ..judge.verdict import Verdict
from ..suite.kernelbench_runs import finding_kinds
from ..suite.revisions import describe
from .module_view import module_section
from .page import Cell, esc, figure, number, pct, table, text

View = tuple[str, str, list[tuple[str, str]], list[dict[str, Any]]]

SUMMARY_KEYS = [("n", "n", None), ("pass_rate", "pass", "rate"), ("faster_than_eager", "faster than eager", "rate"),
                ("faster_than_compile", "faster than torch.compile", "rate"),
                ("geomean_speedup_vs_eager", "geomean vs eager", "x"),
                ("geomean_speedup_vs_compile", "geomean vs torch.compile", "x"), ("mean_reward", "mean reward", None)]
TRAINING_KEYS = {  # the metrics plotted first, with the title and the y axis a reader sees
    "reward_mean": ("mean reward of the batch", "milestone reward (-1..3)"),
    "pass_rate": ("pass rate (correct kernels)", "fraction of episodes"),
    "policy_loss": ("policy loss (PPO, clipped)", "loss"), "value_loss": ("value loss (critic)", "squared error"),
    "approx_kl": ("KL to the policy that sampled", "nats per token"), "entropy": ("policy entropy", "nats per token"),
    "clip_fraction": ("tokens with a clipped ratio", "fraction of tokens"), "loss": ("loss", "loss")}
CLIP = 1200  # characters of a message or observation shown before "more"


def _summary_cell(value: Any, kind: str | None) -> Cell:
    if kind == "rate":
        return Cell(pct(value), value if value is not None else -1)
    return number(value, ".2f", "x") if kind == "x" else number(value, ".3g")


def _levels(suite: dict) -> list[tuple[str, dict]]:
    return [*suite.get("levels", {}).items(), ("overall", suite["overall"])]


def _task_row(record: dict) -> dict[str, Any]:
    v = record["verdict"]
    times = v.get("times_us") or {}
    episode = record.get("episode") or {}
    return {"level": record["level"], "task": record["task"], "reward": v["reward"], "correct": v["correct"],
            "eager_us": times.get("eager"), "compile_us": times.get("compile"), "candidate_us": times.get("candidate"),
            "speedup_vs_eager": v.get("speedup_vs_eager"), "speedup_vs_compile": v.get("speedup_vs_compile"),
            "max_abs_error": v.get("max_abs_error") if v.get("correct") or v.get("max_abs_error") else None,
            "reason": Verdict.from_dict(v).reason, "turns": episode.get("turns"), "stop": episode.get("stop"),
            "strict_findings": "; ".join(finding_kinds(v.get("strict_findings") or [])) or None,
            "task_hash": record.get("task_hash"),
            "kb_vs_eager": (v.get("kernelbench_timing") or {}).get("speedup_vs_eager"),
            "kb_vs_compile": (v.get("kernelbench_timing") or {}).get("speedup_vs_compile"),
            "published": record.get("published")}


def _speedup_plot(suites: list[tuple[str, dict]]) -> str:
    """Speedup of each correct task per level (log scale), vs eager and vs torch.compile, one colour per run."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("vs eager", "vs torch.compile"))
    for index, (name, suite) in enumerate(suites):
        rows = [_task_row(r) for r in suite["tasks"]]
        for col, key in ((1, "speedup_vs_eager"), (2, "speedup_vs_compile")):
            kept = [r for r in rows if r["correct"] and r[key]]
            fig.add_trace(go.Box(x=[r["level"] for r in kept], y=[r[key] for r in kept], name=name,
                                 text=[r["task"] for r in kept], boxpoints="all", jitter=0.4, pointpos=0,
                                 legendgroup=name, showlegend=col == 1 and len(suites) > 1,
                                 marker_color=("#2f5fb3", "#d1702b")[index % 2]), row=1, col=col)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#8a93a3")
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="speedup (x, log scale)", row=1, col=1)
    fig.update_layout(boxmode="group", height=420, margin=dict(t=40, b=40, l=60, r=20))
    return figure(fig)


def _revision_line(revision: dict | None) -> str:
    """Which KernelBench revision the suite's files are (suite/revisions.py)."""
    return f'<p class="muted">{esc(describe(revision))}</p>' if revision else ""


def _two_rules(suite: dict) -> str:
    """Under the kernelbench policy: per level, the pass rate by KernelBench's rules and by the strict judge's (no
    strict finding), and which findings make the difference (e.g. "3 input changed in place")."""
    rows = [[text(name), number(s["n"], "d"), _summary_cell(s["strict"]["pass_rate"], "rate"),
             _summary_cell(s["strict"]["pass_rate_without_findings"], "rate"),
             text("; ".join(f"{n} {kind}" for kind, n in s["strict"]["findings_by_kind"].items()) or "none")]
            for name, s in _levels(suite) if s.get("strict")]
    return table(["level", "n", "pass (KernelBench's rules)", "pass, no strict finding",
                  "findings among KernelBench's passes"], rows, text_columns=(0, 4)) + \
        '<p class="muted">Judged once under <code>--policy kernelbench</code>: its verdict follows KernelBench\'s ' \
        "protocol; the strict judge's checks of the outputs, inputs, weights and timing still ran and their " \
        "findings are counted here, torch calls in the sources and the built library among them. Torch called from " \
        "Python (allowed by KernelBench) is not: only a strict run says whether the candidate's own kernels do all " \
        "the work. Rewards use strict only.</p>"


def _fast_p(suite: dict) -> str:
    """KernelBench's headline metric per level: the share of problems correct and faster than p."""
    keys = list((suite["overall"].get("fast_p_vs_eager") or {}).keys())
    rows = [[text(name), text(baseline)] + [_summary_cell((s.get(f"fast_p_vs_{baseline}") or {}).get(k), "rate")
                                             for k in keys]
            for name, s in _levels(suite) for baseline in ("eager", "compile")]
    return table(["level", "baseline", *keys], rows, text_columns=(0, 1))


def _two_clocks(suite: dict) -> str:
    """Under `--timing kernelbench`: per level, the speedups by KernelBench's own timing (made in the candidate's
    process) beside the judge's, over the same tasks."""
    rows = [[text(name), number(k["timed"], "d")] + [
        number(k[key], ".2f", "x") if "ratio" not in key else number(k[key], ".2f")
        for key in ("geomean_speedup_vs_eager", "geomean_speedup_vs_eager_ours", "median_ratio_eager",
                    "geomean_speedup_vs_compile", "geomean_speedup_vs_compile_ours", "median_ratio_compile")]
            for name, s in _levels(suite) for k in [s.get("kernelbench_timing")] if k]
    method = next(s["kernelbench_timing"]["method"] for _, s in _levels(suite) if s.get("kernelbench_timing"))
    return table(["level", "timed", "x eager (KernelBench's)", "x eager (ours)", "median ratio",
                  "x compile (KernelBench's)", "x compile (ours)", "median ratio"], rows, text_columns=(0,)) + \
        f'<p class="muted">KernelBench\'s timing ({esc(method)}): CUDA events in the candidate\'s own process, its ' \
        "warm-ups, trials and flush; a candidate can fool it, so no verdict uses it. Ours: the judge's clock. The " \
        "median ratio is KernelBench's speedup over ours, task by task.</p>"


def _published_cell(found: dict | None) -> str | None:
    if not found:
        return None
    runtime = f", {found['runtime_ms']:g} ms" if found["runtime_ms"] else ""
    return ("correct" if found["correct"] else "not correct") + runtime


def _published(suite: dict) -> str:
    """Where the generation folder held KernelBench's own results of the run: per level, its pass rate and the
    judge's on the same samples, how many agree, and which do not."""
    rows = [[text(name), number(k["n"], "d"), _summary_cell(k["pass_rate_published"], "rate"),
             _summary_cell(k["pass_rate_here"], "rate"), number(k["agree"], "d"),
             text("; ".join(f"{d['task'].split('/')[-1]} ({'published' if d['published'] else 'here'} correct)"
                            for d in k["disagree"]) or "none"),
             text(", ".join(k["hardware"]) or None), number(k["median_runtime_ratio"], ".2f")]
            for name, k in suite["published"].items() if k]
    return table(["level", "n", "pass (published)", "pass (here)", "agree", "disagree", "published on",
                  "median runtime ratio"], rows, text_columns=(0, 5, 6)) + \
        '<p class="muted">Published: <code>eval_results.json</code> beside the samples (KernelBench\'s own ' \
        "evaluation of this run, on its hardware). Runtime ratio: its runtime over the judge's candidate time, " \
        "task by task, over samples correct in both.</p>"


def suite_view(suite: dict) -> View:
    keys = SUMMARY_KEYS + ([("reference_errors", "reference failed here (the task's or the machine's)", None)]
                           if any(s.get("reference_errors") for _, s in _levels(suite)) else [])
    levels = table(["level"] + [label for _, label, _ in keys],
                   [[text(name)] + [_summary_cell(s.get(k), kind) for k, _, kind in keys]
                    for name, s in _levels(suite)], text_columns=(0,))
    rows = [_task_row(r) for r in suite["tasks"]]
    episodes = any(r["turns"] is not None for r in rows)
    lenient = any(r["verdict"].get("policy") == "kernelbench" for r in suite["tasks"])
    clocks = any(r["kb_vs_eager"] for r in rows)
    public = any(r["published"] for r in rows)
    headers = ["level", "task", "reward", "correct", "eager (us)", "compile (us)", "candidate (us)", "x eager",
               "x compile", "max abs error", *(["turns", "stop"] if episodes else []),
               *(["strict findings"] if lenient else []), *(["x eager (KB timing)", "x compile (KB timing)"]
                                                             if clocks else []),
               *(["published"] if public else []), "task hash", "reason"]
    cells = [[text(r["level"]), text(r["task"].split("/")[-1]), number(r["reward"], "d"),
              Cell("yes" if r["correct"] else "no", int(r["correct"]), "good" if r["correct"] else "bad"),
              number(r["eager_us"], ".1f"), number(r["compile_us"], ".1f"), number(r["candidate_us"], ".1f"),
              number(r["speedup_vs_eager"], ".2f", "x"), number(r["speedup_vs_compile"], ".2f", "x"),
              number(r["max_abs_error"], ".2e"),
              *([number(r["turns"], "d"), text(r["stop"])] if episodes else []),
              *([text(r["strict_findings"] or "none")] if lenient else []),
              *([number(r["kb_vs_eager"], ".2f", "x"), number(r["kb_vs_compile"], ".2f", "x")] if clocks else []),
              *([text(_published_cell(r["published"]))] if public else []),
              text((r["task_hash"] or "")[:12] or None), text(r["reason"], "text reason")]
             for r in rows]
    failing = sum(1 for r in rows if not r["correct"])
    sections = [("Per level (the paper's table)", levels + f'<p class="muted">{esc(suite.get("note", ""))}</p>'
                 + _revision_line(suite.get("suite_revision")))]
    if any(s.get("strict") for _, s in _levels(suite)):
        sections.append(("KernelBench's rules and the strict judge's", _two_rules(suite)))
    if suite.get("published"):
        sections.append(("KernelBench's published results and the verdicts here", _published(suite)))
    if suite["overall"].get("kernelbench_timing"):
        sections.append(("KernelBench's timing and the judge's", _two_clocks(suite)))
    if suite["overall"].get("fast_p_vs_eager"):
        sections.append(("KernelBench's fast_p (correct and faster than p)", _fast_p(suite)))
    sections += [("Speedup distribution per level (correct tasks)", _speedup_plot([("run", suite)])),
                (f"Tasks ({len(rows)}, {failing} not correct; click a header to sort)",
                 table(headers, cells, sortable=True, text_columns=tuple(
                     i for i, h in enumerate(headers) if h in ("level", "task", "strict findings", "published",
                                                               "task hash", "reason"))))]
    return "Suite report", f"from <code>{esc(suite['source'])}</code>{_run_line(suite)}", sections, rows


def _run_line(suite: dict) -> str:
    """When, on what and with which versions the run was judged (runs since its record was kept)."""
    if not isinstance(suite.get("run"), dict):
        return ""
    r = suite["run"]
    ended = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.get("finished") or r.get("started") or 0))
    return esc(f" · run {r.get('id') or '-'}, ended {ended} · suite {r.get('suite')} · solutions {r.get('solutions')}"
               f" · {r.get('backend')} on {r.get('machine')} · torch {r.get('torch_version')} · cuda-agent "
               f"{r.get('version')}")


def _first_samples(run: dict) -> dict[str, dict]:
    """Each task's first record: sample 0 of a generation folder (what `suite.evaluate.report` summarises)."""
    first: dict[str, dict] = {}
    for r in run["tasks"]:
        first.setdefault(r["task"], r)
    return first


def compare_view(a: dict, b: dict) -> View:
    """Run B beside run A: each summary number with its change, and per task the rewards and speedups of both. The
    geometric means are over correct tasks only: when the correct tasks differ, their change is not coloured a
    gain or a loss, and the tasks B lost are named first."""
    header = ["level"] + [f"{label}: A → B (change)" for _, label, _ in SUMMARY_KEYS[1:]]
    first = [_first_samples(run) for run in (a, b)]  # the records the summaries are over
    passing = [{task for task, r in records.items() if r["verdict"]["correct"]} for records in first]
    lost, gained = sorted(passing[0] - passing[1]), sorted(passing[1] - passing[0])
    summary_rows = []
    for name, sa in _levels(a):
        sb = dict(_levels(b)).get(name, {})
        row = [text(name)]
        for key, _, kind in SUMMARY_KEYS[1:]:
            x, y = sa.get(key), sb.get(key)
            delta = y - x if isinstance(x, (int, float)) and isinstance(y, (int, float)) else None
            same_tasks = not key.startswith("geomean") or passing[0] == passing[1]
            css = "muted" if not delta or not same_tasks else ("good" if delta > 0 else "bad")
            change = _summary_cell(delta, kind)
            shown = (f"{_summary_cell(x, kind).shown} → {_summary_cell(y, kind).shown} "
                     f'<span class="{css}">({"+" if delta and delta > 0 else ""}{change.shown})</span>')
            row.append(Cell(shown, change.sort))
        summary_rows.append(row)
    by_task = {task: _task_row(r) for task, r in first[1].items()}
    rows = []
    for record in first[0].values():
        ra, rb = _task_row(record), by_task.get(record["task"])
        rows.append({"level": ra["level"], "task": ra["task"], "reward_a": ra["reward"],
                     "reward_b": rb["reward"] if rb else None, "speedup_vs_compile_a": ra["speedup_vs_compile"],
                     "speedup_vs_compile_b": rb["speedup_vs_compile"] if rb else None,
                     "reason_b": rb["reason"] if rb else "not in run B"})
    cells = []
    for r in rows:
        change = r["reward_b"] - r["reward_a"] if r["reward_b"] is not None else None
        cells.append([text(r["level"]), text(r["task"].split("/")[-1]), number(r["reward_a"], "d"),
                      number(r["reward_b"], "d"),
                      number(change, "+d", css="" if not change else ("good" if change > 0 else "bad")),
                      number(r["speedup_vs_compile_a"], ".2f", "x"), number(r["speedup_vs_compile_b"], ".2f", "x"),
                      text(r["reason_b"], "text reason")])
    changed = "".join(f'<p class="{css}">{esc(what)}: {len(names)} ({esc(", ".join(names[:20]))}'
                      f'{" ..." if len(names) > 20 else ""})</p>'
                      for css, what, names in (("bad", "passing in A, not in B", lost),
                                               ("good", "passing in B, not in A", gained)) if names)
    if changed:
        changed += ('<p class="muted">the geometric means are over different tasks in A and B, so their changes '
                    "are not coloured as gains or losses</p>")
    sections = [("Per level, A then B", changed + table(header, summary_rows, text_columns=(0,))),
                ("Speedup distribution per level (correct tasks)", _speedup_plot([("A", a), ("B", b)])),
                ("Tasks", table(["level", "task", "reward A", "reward B", "change", "x compile A", "x compile B",
                                 "reason (B)"], cells, sortable=True, text_columns=(0, 1, 7)))]
    meta = (f"A: <code>{esc(a['source'])}</code>{_run_line(a)}<br>B: <code>{esc(b['source'])}</code>"
            f"{_run_line(b)}")
    return "Suite report: A vs B", meta, sections, rows


def _clipped(value: Any) -> str:
    body = value if isinstance(value, str) else json.dumps(value, indent=1)
    if len(body) <= CLIP:
        return f"<pre>{esc(body)}</pre>"
    return (f"<pre>{esc(body[:CLIP])}</pre><details><summary>{len(body) - CLIP} more characters</summary>"
            f"<pre>{esc(body[CLIP:])}</pre></details>")


def _verdict_line(v: dict) -> str:
    css = "good" if v.get("correct") else "bad"
    parts = [f'<span class="{css}">{"correct" if v.get("correct") else "not correct"}</span>',
             f"reward {esc(str(v.get('reward')))}"]
    for key, label in (("speedup_vs_eager", "x eager"), ("speedup_vs_compile", "x compile")):
        if v.get(key):
            parts.append(f"{v[key]:.2f} {label}")
    reason = Verdict.from_dict(v).reason
    if reason:
        parts.append(esc(reason[:300]))
    return " &middot; ".join(parts)


def agent_view(run: dict) -> View:
    summary = EpisodeSummary.from_dict(run["summary"]) if run["summary"] else None  # None: the run did not end
    records = run["records"]
    rows, points = [], []
    for r in records:
        kind = r.get("type")
        if kind not in ("system", "user", "assistant", "tool", "event"):
            continue
        message = r.get("message") or {}
        if kind == "assistant":
            calls = [f"{c['function']['name']}({c['function'].get('arguments', '')})"
                     for c in message.get("tool_calls") or []]
            body = (message.get("content") or "") + ("\n\ncalls: " + "\n".join(calls) if calls else "")
            what = "model"
        elif kind == "tool":
            body, what = message.get("content") if message else r.get("observation", ""), r.get("tool", "tool")
        else:
            body, what = message.get("content") if message else r.get("error", r.get("event", "")), kind
        verdict = r.get("verdict")
        if verdict:
            points.append((r.get("turn"), verdict))
        rows.append({"turn": r.get("turn"), "t_s": r.get("t"), "who": what, "text": body or "",
                     "verdict": _verdict_line(verdict) if verdict else "", "reward": (verdict or {}).get("reward"),
                     "speedup_vs_compile": (verdict or {}).get("speedup_vs_compile")})
    turns = table(["turn", "t (s)", "who", "message / observation", "verdict"],
                  [[number(r["turn"], "d"), number(r["t_s"], ".1f"), text(r["who"]),
                    Cell(_clipped(r["text"]), "", "text"), Cell(r["verdict"], "", "text")] for r in rows],
                  text_columns=(2, 3, 4))
    final = summary.final_verdict if summary else None
    facts = [("reference", summary.reference), ("model", summary.model), ("stop", summary.stop),
             ("turns", summary.turns), ("wall (s)", summary.wall_s), ("snapshots", summary.snapshots),
             ("best snapshot", summary.best_snapshot)] if summary else [("summary", "none: the run did not end")]
    overview = table(["", ""], [[text(k), text(v)] for k, v in facts], text_columns=(0, 1))
    overview += f"<p>final verdict: {_verdict_line(final)}</p>" if final else "<p class='muted'>no verdict</p>"
    sections = [("Episode", overview)]
    if run.get("module"):
        sections.append(module_section(run["module"]))
    if points:
        sections.append(("Reward and speedup over turns", _progress_plot(points)))
    sections.append((f"Turn by turn ({len(rows)} messages; long ones clipped)", turns))
    name = Path((summary and summary.reference) or run["source"]).name
    return f"Agent run: {name}", f"from <code>{esc(run['source'])}</code>", sections, rows


def _progress_plot(points: list[tuple[Any, dict]]) -> str:
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    turns = [t for t, _ in points]
    fig.add_trace(go.Scatter(x=turns, y=[v.get("reward") for _, v in points], mode="lines+markers",
                             name="reward", line_shape="hv"), secondary_y=False)
    fig.add_trace(go.Scatter(x=turns, y=[v.get("speedup_vs_compile") for _, v in points], mode="markers",
                             name="speedup vs torch.compile", marker_symbol="diamond", marker_size=10),
                  secondary_y=True)
    fig.update_xaxes(title_text="turn")
    fig.update_yaxes(title_text="milestone reward", secondary_y=False)
    fig.update_yaxes(title_text="speedup (x)", secondary_y=True)
    fig.update_layout(height=340, margin=dict(t=20, b=40, l=60, r=60))
    return figure(fig)


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def training_view(run: dict) -> View:
    steps = run["steps"]
    scalars = [k for k in dict.fromkeys(k for s in steps for k in s) if k != "step"
               and any(_scalar(s.get(k)) for s in steps)]
    shown = [k for k in TRAINING_KEYS if k in scalars] or scalars[:6]
    cols = 2
    fig = make_subplots(rows=math.ceil(len(shown) / cols), cols=cols,
                        subplot_titles=[TRAINING_KEYS.get(k, (k,))[0] for k in shown])
    for i, key in enumerate(shown):
        kept = [s for s in steps if _scalar(s.get(key)) and math.isfinite(s[key])]
        fig.add_trace(go.Scatter(x=[s["step"] for s in kept], y=[s[key] for s in kept], mode="lines+markers",
                                 name=key, showlegend=False), row=i // cols + 1, col=i % cols + 1)
        fig.update_yaxes(title_text=TRAINING_KEYS.get(key, ("", key))[1], row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(title_text="training step")
    fig.update_layout(height=260 * math.ceil(len(shown) / cols), margin=dict(t=40, b=40, l=60, r=20))
    rows = [{"step": s["step"], **{k: s.get(k) for k in scalars}} for s in steps]
    headers = ["step", *(TRAINING_KEYS.get(k, (k,))[0] for k in scalars)]
    steps_table = table(headers, [[number(r["step"], "d")] + [number(r[k], ".4g") for k in scalars] for r in rows],
                        sortable=True)
    config = run.get("config") or {}
    meta = f"from <code>{esc(run['source'])}</code>" + (f" &middot; model <code>{esc(config['model'])}</code>"
                                                         if config.get("model") else "")
    sections = [("Over steps", figure(fig)), (f"Every step ({len(rows)})", f'<div style="overflow-x:auto">'
                                              f"{steps_table}</div>")]
    return "Training report", meta, sections, rows
