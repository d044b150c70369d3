"""A suite run's record: what was judged, where, with what, and when (`RunInfo`, the report's "run"); eval-suite
keeps each finished run in its results database under a number, by which `cuda-agent report` lists and picks it."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..judge.store import Store

RUNS = "runs"  # the store's namespace of finished runs


@dataclass
class RunInfo:
    suite: str
    solutions: str
    backend: str
    machine: str  # the devices, their driver and runtime (Backend.machine)
    torch_version: str
    version: str  # cuda-agent's
    started: float
    finished: float = 0.0
    id: str = ""  # the run's number in the database ("" until stored)

    @classmethod
    def begin(cls, pool, suite_dir: Path, solutions_dir: Path) -> "RunInfo":
        import torch

        from .. import __version__

        return cls(str(Path(suite_dir).resolve()), str(Path(solutions_dir).resolve()), pool.backend.name,
                   pool.backend.machine(), torch.__version__, __version__, time.time())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunInfo":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def finish(report: dict, info: RunInfo) -> dict:
    """The report with its run record (ended now)."""
    info.finished = time.time()
    return {**report, "run": asdict(info)}


def save(store: Store, report: dict) -> str:
    """Keep a finished run's report under the next run number; returns it (also set in the report's record)."""
    report["run"]["id"] = store.append(RUNS, report)
    return report["run"]["id"]


def stored(store: Store) -> list[dict]:
    """Every run's report, oldest first, each with its number in its record."""
    return [{**report, "run": {**report["run"], "id": key}} for key, report, _ in store.entries(RUNS)]


def pick(store: Store, run_id: str | None) -> dict:
    """The run numbered `run_id` (None: the latest); LookupError naming the runs there when there is no such run."""
    runs = stored(store)
    if not runs:
        raise LookupError("holds no suite run yet (eval-suite stores one when a run ends)")
    if run_id is None:
        return runs[-1]
    found = [r for r in runs if r["run"]["id"] == str(run_id)]
    if not found:
        raise LookupError(f"has no run {run_id} (runs {runs[0]['run']['id']}-{runs[-1]['run']['id']}; "
                          "`cuda-agent report DB --list` lists them)")
    return found[0]
