"""Rejection fine-tuning data (the paper's stage 2): the agent trajectories worth imitating, as chat SFT rows.

A trajectory is kept when its final verdict has a positive reward and no policy violation, and the model never
called a tool that does not exist (hallucinated), never sent arguments that are not a JSON object of the tool's
parameters (malformed), never replied without a tool call (the loop had to nudge it), and never looped: the same
call repeated `max_repeats` times in a row, or a failing call sent again as the very next call (with nothing
changed in between: a `verify` after an edit is the normal fix loop). Every rejection is counted by
its reason.

Only the loop's own run folders count: `run_folders` and `export` skip any folder inside another run folder (its
workspace/, which the policy writes: a trajectory.jsonl there is whatever the policy wants trained in), and
`export` refuses a trajectory whose result record contradicts the verdict files the loop wrote beside it
(summary.json, best_verdict.json).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agent.loop import MALFORMED as LOOP_MALFORMED
from ..agent.summary import EpisodeSummary

TRAJECTORY = "trajectory.jsonl"
HALLUCINATED = "error: unknown tool"
UNREADABLE = LOOP_MALFORMED.split(":")[0]  # how the loop answers a <tool_call> block it cannot parse
MALFORMED = ("bad arguments", "arguments are not valid JSON", "arguments must be a JSON object")


@dataclass
class RFTFilter:
    min_reward: int = 1
    max_repeats: int = 3  # the same call this many times in a row is a loop


def run_folders(root: Path) -> list[Path]:
    """The episode run folders at or under `root` (any depth): those holding a trajectory.jsonl, less those inside
    another one (its workspace/). The loop opens a run folder's trajectory.jsonl before the policy acts, so a
    workspace always has one above it, even when the episode was killed before its summary.json."""
    return [run for run in sorted(p.parent for p in Path(root).rglob(TRAJECTORY) if p.is_file()) if not _nested(run)]


def _nested(run: Path) -> bool:
    """Whether `run` is inside another run folder (in its workspace/, which the policy writes)."""
    return any((up / TRAJECTORY).is_file() for up in Path(run).absolute().parents)


def read_trajectory(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rejection(records: list[dict[str, Any]], rule: RFTFilter, run: Path | None = None) -> str | None:
    """Why the trajectory is not kept (None: kept); `run`: its run folder, whose verdict files the result record
    must agree with."""
    result = next((r for r in reversed(records) if r.get("type") == "result"), None)
    if result is None:
        return "unfinished episode (no result record)"
    if run is not None and (contradicted := _contradicted(result["summary"], Path(run))):
        return f"result record contradicts {contradicted}"
    final = EpisodeSummary.from_dict(result["summary"]).final_verdict or {}
    if (final.get("reward") if final.get("reward") is not None else -1) < rule.min_reward:
        return f"reward below {rule.min_reward}"
    if final.get("policy_violations"):
        return "policy violation"
    calls: list[tuple[str, str]] = []  # every call, in order
    failed: list[bool] = []  # whether each executed call failed
    for record in records:
        kind = record.get("type")
        if kind == "assistant":
            sent = [(c["function"]["name"], _canonical(c["function"].get("arguments")))
                    for c in record["message"].get("tool_calls") or []]
            if not sent:
                return "a reply without a tool call"
            for call in sent:
                if calls and calls[-1] == call and len(failed) == len(calls) and failed[-1]:
                    return f"a failing call sent again unchanged ({call[0]})"
                calls.append(call)
                if calls[-rule.max_repeats:] == [call] * rule.max_repeats:
                    return f"the same call {rule.max_repeats} times in a row ({call[0]})"
        elif kind == "user" and (record.get("malformed") or
                                 (record["message"].get("content") or "").startswith(UNREADABLE)):
            return "an unreadable tool call"
        elif kind == "tool":
            observation = record["message"].get("content") or ""
            if observation.startswith(HALLUCINATED):
                return "a hallucinated tool"
            if record.get("error") and any(m in observation for m in MALFORMED):
                return "malformed arguments"
            failed.append(bool(record.get("error")) or _failed(record))
    return None


def _contradicted(summary: dict[str, Any], run: Path) -> str | None:
    """The verdict file the loop wrote in `run` that the result record's summary differs from (one not there is
    not checked; best_verdict.json only when the summary has a final verdict: an earlier episode's may remain)."""
    for name, claimed in (("summary.json", summary), ("best_verdict.json", summary.get("final_verdict"))):
        path = run / name
        if claimed is not None and path.is_file() and _canonical(claimed) != _canonical(path.read_text()):
            return name
    return None


def _canonical(arguments: Any) -> str:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return str(arguments)
    return json.dumps(value, sort_keys=True)


def _failed(record: dict[str, Any]) -> bool:
    """A judged call whose candidate failed (compile error, wrong result)."""
    verdict = record.get("verdict")
    return verdict is not None and not verdict.get("correct")


def export(run_dirs: list[Path], out: Path, rule: RFTFilter | None = None) -> dict[str, Any]:
    """Write the kept trajectories as `out/rft.jsonl` and `out/rft.parquet` (one conversation per row: messages and
    tools as JSON, the reward, the speedup, the run folder); return the counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..agent.tools import SCHEMAS

    rule = rule or RFTFilter()
    rows, reasons = [], Counter()
    for run in run_dirs:
        path = Path(run) / TRAJECTORY
        if not path.is_file():
            reasons["no trajectory.jsonl"] += 1
            continue
        if _nested(run):
            reasons["inside another run folder"] += 1
            continue
        records = read_trajectory(path)
        why = rejection(records, rule, Path(run))
        if why:
            reasons[why.split(" (")[0]] += 1
            continue
        summary = EpisodeSummary.from_dict(records[-1]["summary"])
        messages = [r["message"] for r in records if r.get("type") in ("system", "user", "assistant", "tool")]
        rows.append({"messages": json.dumps(messages), "tools": json.dumps(SCHEMAS),
                     "reward": summary.final_verdict["reward"],
                     "speedup_vs_compile": summary.final_verdict.get("speedup_vs_compile"),
                     "reference": summary.reference, "run_dir": str(run)})
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "rft.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    columns = ("messages", "tools", "reward", "speedup_vs_compile", "reference", "run_dir")
    pq.write_table(pa.table({c: [r[c] for r in rows] for c in columns}) if rows else
                   pa.table({c: pa.array([], pa.string()) for c in columns}), out / "rft.parquet")
    return {"kept": len(rows), "seen": len(run_dirs), "rejected": dict(reasons)}
