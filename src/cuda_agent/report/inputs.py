"""What a report is made from: each thing the project writes, recognised and read into one plain dict.

    suite     eval-suite's database (SQLite; its latest run, or the one picked), a report JSON (`eval-suite --json`,
              optimize-suite's OUT/report.json) or an optimize-suite folder (OUT/report.json + OUT/runs)
    agent     an agent run folder (trajectory.jsonl, summary.json; module.json from optimize --module) or its
              trajectory.jsonl
    training  a trainer's folder or its metrics.jsonl (one JSON object per step)
    recipe    a `train recipe` folder (recipe.json, ppo/metrics.jsonl); several of them (seeds) drawn together
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from ..judge.store import Store
from ..suite import runs


class ReportInputError(ValueError):
    """The input is missing, unreadable, or not something the project writes."""


def load(path: Path, run: str | None = None) -> dict[str, Any]:
    """The input as {"kind": "suite"|"agent"|"training"|"recipe", "source": str, ...}; `run` picks a run of a
    suite database (default: its latest)."""
    path = Path(path)
    if not path.exists():
        raise ReportInputError(f"{path}: no such file or folder")
    if run is not None and not is_database(path):
        raise ReportInputError(f"{path}: a run is picked in eval-suite's database only (this is no database)")
    if path.is_dir():
        for name, reader in (("report.json", _suite_json), ("trajectory.jsonl", _agent), ("metrics.jsonl", _training),
                             ("recipe.json", _recipe)):
            if (path / name).is_file():
                return reader(path / name)
        raise ReportInputError(f"{path}: no report.json (optimize-suite), trajectory.jsonl (agent run), "
                               "metrics.jsonl (training) or recipe.json (train recipe) in this folder")
    if is_database(path):
        return _suite_db(path, run)
    if path.name == "trajectory.jsonl":
        return _agent(path)
    if path.suffix == ".jsonl":
        return _training(path)
    if path.suffix == ".json":
        return _suite_json(path)
    raise ReportInputError(f"{path}: not a suite database, report JSON, trajectory.jsonl or metrics.jsonl")


def is_database(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return path.suffix in (".sqlite", ".db") or f.read(16) == b"SQLite format 3\x00"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportInputError(f"{path}: not readable as JSON ({exc})") from None


def _jsonl(path: Path) -> list[dict]:
    lines = path.read_text(errors="replace").splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):  # only the last line may be cut (a crash mid-write)
                raise ReportInputError(f"{path}:{number}: not a JSON line") from None
    return rows


def _suite(report: Any, source: Path) -> dict[str, Any]:
    if not (isinstance(report, dict) and isinstance(report.get("tasks"), list) and "overall" in report):
        raise ReportInputError(f"{source}: not a suite report (expected the keys levels, overall, tasks)")
    return {"kind": "suite", "source": str(source), **report}


def _suite_json(path: Path) -> dict[str, Any]:
    suite = _suite(_json(path), path)
    if path.name == "report.json" and (path.parent / "runs").is_dir():
        suite["source"] = str(path.parent)  # an optimize-suite folder: its tasks carry their episodes
    return suite


def database_runs(path: Path) -> list[dict[str, Any]]:
    """Every run of a suite database, oldest first."""
    try:
        return runs.stored(Store(path, read_only=True))
    except sqlite3.DatabaseError as exc:
        raise ReportInputError(f"{path}: not an eval-suite database ({exc})") from None


def _suite_db(path: Path, run: str | None) -> dict[str, Any]:
    try:
        report = runs.pick(Store(path, read_only=True), run)
    except sqlite3.DatabaseError as exc:
        raise ReportInputError(f"{path}: not an eval-suite database ({exc})") from None
    except LookupError as exc:
        raise ReportInputError(f"{path}: {exc}") from None
    return _suite(report, path)


def _agent(path: Path) -> dict[str, Any]:
    records = _jsonl(path)
    if not records or not any(r.get("type") in ("assistant", "tool") for r in records):
        raise ReportInputError(f"{path}: not an agent trajectory (no assistant or tool records)")
    summary_file = path.parent / "summary.json"
    summary = _json(summary_file) if summary_file.is_file() else next(
        (r["summary"] for r in records if r.get("type") == "result"), {})
    module = path.parent / "module.json"  # optimize --module / --hf-model: the export and whole-model check
    return {"kind": "agent", "source": str(path.parent), "records": records, "summary": summary,
            "module": _json(module) if module.is_file() else None}


def _training(path: Path) -> dict[str, Any]:
    steps = _jsonl(path)
    if not steps or not all(isinstance(s, dict) and "step" in s for s in steps):
        raise ReportInputError(f"{path}: not a trainer's metrics (each line needs a 'step')")
    config_file = path.parent / "config.json"
    config = _json(config_file) if config_file.is_file() else {}
    return {"kind": "training", "source": str(path), "steps": steps, "config": config}


def _recipe(path: Path) -> dict[str, Any]:
    """A `train recipe` folder: its recipe.json, and the metrics of its PPO stage (the stability signals)."""
    recipe = _json(path)
    if not isinstance(recipe, dict) or "heldout" not in recipe or "arm" not in recipe:
        raise ReportInputError(f"{path}: not a recipe's result (no 'arm' and 'heldout')")
    metrics = path.parent / "ppo" / "metrics.jsonl"
    return {"kind": "recipe", "source": str(path.parent), "recipe": recipe,
            "steps": _jsonl(metrics) if metrics.is_file() else []}
