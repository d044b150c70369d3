"""`cuda-agent check-model`: the user's whole transformers model with submodules replaced by an exported kernel's
drop-in module, against the model as it is: outputs (the judge's tolerance, and each one's error against the model
in fp64) and time (the judge's timing loop: warm-ups, an L2 flush before each call, the median), so the user sees
what the kernel buys end to end, not only on the isolated task.

A submodule is replaced by the export's drop-in class built as the export's task builds it (a task made by `task
new --hf-model` builds it from the model's config, so it takes no arguments) with the submodule's own state dict,
strictly: a kernel exported for another configuration is refused there. The model is the user's own, the kernel's
code the agent's: the check runs in a sandboxed process of its own (`isolated.py`), never in this one.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..backend import get_backend
from ..judge.config import JudgeConfig
from ..judge.wire.timing import time_callable


class CheckError(ValueError):
    """The model, the replacement or the sample cannot be checked; the message says which."""


@dataclass
class ModelCheck:
    replaced: list[str]
    max_abs_diff: float
    within_tolerance: bool
    error_vs_fp64: dict[str, float]
    time_us: dict[str, float] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.time_us["original"] / self.time_us["replaced"]


def load_export(folder: Path):
    """The exported package at `folder` (the NAME/ folder `export` wrote)."""
    init = Path(folder) / "__init__.py"
    if not init.is_file() or not (Path(folder) / "_runtime.py").is_file():
        raise CheckError(f"{folder}: not a package `cuda-agent export` wrote (no __init__.py and _runtime.py)")
    name = f"cuda_agent_checked_{Path(folder).name}"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def replace(model: torch.nn.Module, pattern: str, package) -> list[str]:
    """Every submodule whose name matches `pattern` (fnmatch) swapped for the export's drop-in module holding its
    weights; their names."""
    names = [n for n, _ in model.named_modules() if n and fnmatch.fnmatchcase(n, pattern)]
    if not names:
        raise CheckError(f"no submodule matches {pattern!r}")
    export = package._export
    for name in names:
        original = model.get_submodule(name)
        try:
            drop_in = export.module(*export.task.get_init_inputs())
            drop_in.load_state_dict(original.state_dict(), strict=True)
        except (RuntimeError, TypeError) as exc:
            raise CheckError(f"{name} ({type(original).__name__}) does not take the export's module: {exc}") from exc
        model.set_submodule(name, drop_in.to(next(original.parameters(), torch.empty(0)).device).eval())
    return names


def check(model_dir: Path, pattern: str, export_dir: Path, sample: torch.Tensor, backend: str,
          hidden: list[Path] = ()) -> ModelCheck:
    """The check, in a process of its own that sees neither `hidden` nor the judge's default cache."""
    from ..judge.config import default_cache_dir
    from . import isolated

    with tempfile.TemporaryDirectory(prefix="cuda-agent-check-") as tmp:
        found = isolated.run("check-model", {"model_dir": str(model_dir), "pattern": pattern,
                                             "export_dir": str(export_dir), "sample": sample.tolist(),
                                             "backend": backend},
                             Path(tmp), [Path(model_dir), Path(export_dir)], [default_cache_dir(), *hidden])
    return ModelCheck(**found["check"])


def check_here(model_dir: str, pattern: str, export_dir: str, sample: list, backend: str) -> dict:
    """(In the check's own process) the model as it is, then with the export swapped in: `ModelCheck`'s fields."""
    from transformers import AutoModelForCausalLM

    device = get_backend(backend).device
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    ids = torch.tensor(sample).to(device)
    cfg = JudgeConfig()
    with torch.no_grad():
        before = model(ids).logits
        exact = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).to(device).eval()(ids).logits
        original_time = _median_us(lambda: model(ids), backend, cfg)
        replaced = replace(model, pattern, load_export(export_dir))
        after = model(ids).logits
        replaced_time = _median_us(lambda: model(ids), backend, cfg)
    return asdict(ModelCheck(replaced, float((after - before).abs().max()),
                             bool(torch.allclose(after, before, atol=cfg.atol, rtol=cfg.rtol)),
                             {"original": float((before.double() - exact).abs().max()),
                              "replaced": float((after.double() - exact).abs().max())},
                             {"original": original_time, "replaced": replaced_time}))


def _median_us(fn, backend: str, cfg: JudgeConfig) -> float:
    return time_callable(fn, get_backend(backend), cfg.warmup, cfg.min_iters, cfg.max_iters,
                         cfg.target_time_s)["median_us"]
