"""`cuda-agent report`: what the project writes (suite results, agent runs, training metrics) as one self-contained
HTML page, with the same numbers beside it as CSV and JSON."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .inputs import ReportInputError, load
from .page import document
from .recipe_view import recipe_view
from .views import agent_view, compare_view, suite_view, training_view

__all__ = ["ReportInputError", "write_report"]


def write_report(source: Path, out: Path, compare: Path | None = None, run: str | None = None,
                 compare_run: str | None = None, seeds: tuple[Path, ...] = ()) -> list[Path]:
    """Write OUT (HTML), OUT with .csv (the main table) and .json (everything read); returns the three paths.
    With `compare` or `compare_run`, two suite inputs side by side (`source` is A; B is `compare`, or `source`
    again with its run `compare_run`); `run` and `compare_run` pick runs of suite databases (default: the latest).
    `seeds`: more recipe folders (other seeds of the same recipe), drawn with `source` as one."""
    data = load(source, run)
    if seeds:
        runs = [data, *(load(path) for path in seeds)]
        if any(r["kind"] != "recipe" for r in runs):
            raise ReportInputError("--seed-run takes recipe folders (train recipe's --out), as INPUT must be")
        data = {"kind": "recipes", "runs": runs}
    if compare is not None or compare_run is not None:
        other = load(compare or source, compare_run)
        if data["kind"] != "suite" or other["kind"] != "suite":
            raise ReportInputError(f"--compare takes two suite inputs; got a {data['kind']} and a {other['kind']}")
        if Path(data["source"]).resolve() == Path(other["source"]).resolve() and data.get("run") == other.get("run"):
            raise ReportInputError(f"A and B are the same run of {source}: pick B with --compare-run ID (or A with "
                                   "--run ID; --list lists the runs)")
        title, meta, sections, rows = compare_view(data, other)
        data = {"a": data, "b": other}
    elif data["kind"] in ("recipe", "recipes"):
        title, meta, sections, rows = recipe_view(data.get("runs") or [data])
    else:
        view = {"suite": suite_view, "agent": agent_view, "training": training_view}[data["kind"]]
        title, meta, sections, rows = view(data)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(document(title, meta, sections), encoding="utf-8")
    table, everything = out.with_suffix(".csv"), out.with_suffix(".json")
    with table.open("w", newline="") as f:
        columns = list(dict.fromkeys(k for r in rows for k in r))
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows({k: "" if r.get(k) is None else r[k] for k in columns} for r in rows)
    everything.write_text(json.dumps(data, indent=1, default=str))
    return [out, table, everything]
