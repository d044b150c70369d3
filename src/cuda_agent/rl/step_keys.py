"""What a recipe step's result depends on, as one short key (recipe.py): the content of the model it starts from,
of its tasks, and the settings that change what it computes. A step's `done.json` keeps its key, so a rerun into
the same folder with other settings or inputs is refused instead of silently mixing two runs, and a step of
another run with the same key (another arm of the same seed, or a run brought back from another machine) can be
taken as it is."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .config import StageConfig

KEY_FILE = "key"  # written into a step's folder when it starts: a half-done step of other settings is not resumed
# what makes a model folder behave: weights, config, tokenizer, chat template
MODEL_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model", ".jinja")


def key(name: str, **parts: Any) -> str:
    """The step `name`'s key over `parts` (JSON-able, or dataclasses and paths)."""
    text = json.dumps({"step": name, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_key(folder: Path) -> str:
    """A model folder's content (the files at its top: weights, config, tokenizer), wherever it lies."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix in MODEL_SUFFIXES):
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()[:16]


def tasks_key(tasks: list[Path]) -> str:
    """The tasks' sources, in order (their file names differ between runs: an export's rows are written anew)."""
    h = hashlib.sha256()
    for task in tasks:
        h.update(Path(task).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def stage_settings(config: StageConfig) -> dict:
    """The settings that change what a stage computes: not its time limit; for a supervised stage (`rft`) not the
    PPO, reward and critic settings it never uses."""
    settings = asdict(config)
    settings.pop("time_limit_s")
    if config.group == 1 or config.stage == "rft":  # (a plain batch: the keys of the runs made before `group`)
        settings.pop("group")
    if config.stage == "rft":
        settings.pop("reward")
        for unused in ("ppo", "critic_lr", "value_head_lr"):
            settings["train"].pop(unused)
    return settings
