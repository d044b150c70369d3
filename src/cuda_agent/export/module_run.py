"""`optimize --module` / `--hf-model`: the kernel engineer's path as one command. The task is made from the module
(user_task.py) into the run folder, the agent's episode runs on it, and its best verified kernel is exported
(package.py) into `RUN/export/` and, for a transformers model, checked in the whole model (check_model.py);
`RUN/module.json` holds what each step made."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from ..user_task import Made, from_file, from_hf, sample_ids
from . import check_model
from .package import export


def make_task(run_dir: Path, module: str | None, init: str, inputs: str | None, hf_model: Path | None,
              submodule: str | None, sample: str | None) -> tuple[Path, Made, str]:
    """The task file in `run_dir`, what making it found, and a package name for its kernel."""
    if module is not None:
        path, _, cls = module.rpartition(":")
        made = from_file(Path(path), cls, init, inputs or "[]")
    else:
        made = from_hf(hf_model, submodule, sample)
    run_dir.mkdir(parents=True, exist_ok=True)
    task = run_dir / "task.py"
    task.write_text(made.source)
    return task, made, re.sub(r"[^a-z0-9_]", "_", made.class_name.lower()) + "_kernel"


def finish(run_dir: Path, task: Path, best_dir: str | None, name: str, backend: str, hf_model: Path | None,
           submodule: str | None, sample: str | None, notes: list[str], cache_dir: Path | None = None) -> dict:
    """The best kernel exported and (from a model) checked in it; the record, also written to module.json."""
    record: dict = {"task": str(task), "task_notes": notes, "export": None, "check": None}
    if best_dir is not None:
        done = export(Path(best_dir), task, name, run_dir / "export", backend, cache_dir)
        record["export"] = {"package": str(done.package), "kernels_build": str(done.hub), "namespace": done.namespace,
                            "class": done.class_name, "notes": done.notes}
        if hf_model is not None:
            checked = check_model.check(hf_model, submodule, done.package, sample_ids(hf_model, sample), backend,
                                        [cache_dir] if cache_dir else [])
            record["check"] = {**asdict(checked), "speedup": checked.speedup}
    (run_dir / "module.json").write_text(json.dumps(record, indent=2))
    return record
