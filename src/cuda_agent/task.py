"""A reference task in KernelBench format: `class Model`, `get_inputs()`, `get_init_inputs()`.

The judge's process only parses the file; it is imported and run in the reference worker, which reports
import and run failures back as `TaskError`s (a broken reference is the user's error, not the candidate's).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REQUIRED = ("Model", "get_inputs", "get_init_inputs")


class TaskError(ValueError):
    """The reference file is unusable; the message is one line a user can act on."""


@dataclass(frozen=True)
class Task:
    path: Path
    source: str

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


def load_task(path: str | Path) -> Task:
    """Read and statically check a reference file."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"reference {path}: no such file")
    try:
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise TaskError(f"reference {path}: cannot parse: {exc}") from exc
    defined = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    defined |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    missing = [name for name in REQUIRED if name not in defined]
    if missing:
        raise TaskError(f"reference {path}: missing {', '.join(missing)} (KernelBench format needs "
                        "class Model, get_inputs() and get_init_inputs())")
    return Task(path=path.resolve(), source=source)


def import_file(path: str | Path, module_name: str) -> ModuleType:
    """Import a Python file as a fresh module (the file's folder goes first on sys.path)."""
    path = Path(path).resolve()
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
