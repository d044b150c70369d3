"""A task's source text as the dataset pipeline handles it: run it as a module, or change its batch size."""

from __future__ import annotations

import types


def load(source: str) -> types.ModuleType:
    """The task's module (Model, get_inputs, get_init_inputs), executed from its source."""
    module = types.ModuleType("task")
    exec(compile(source, "<task>", "exec"), module.__dict__)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, name):
            raise ValueError(f"the task defines no {name}")
    return module


def with_batch(source: str, batch: int) -> str:
    """The same task at another batch size (its module-level `BATCH = ...` line)."""
    lines = [f"BATCH = {batch}" if line.startswith("BATCH = ") else line for line in source.splitlines()]
    return "\n".join(lines) + "\n"
