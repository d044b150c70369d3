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


DATASET_SUFFIXES = (".parquet", ".jsonl")


def dataset_codes(path: str | Path) -> list[str]:
    """The reference sources of a `cuda-agent data build` export (parquet or JSONL, column `code`), in row order."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"dataset {path}: no such file")
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path, columns=["code"]).column("code").to_pylist()
        import json

        return [json.loads(line)["code"] for line in path.read_text().splitlines() if line.strip()]
    except Exception as exc:  # a damaged or foreign file: one line the user can act on
        raise TaskError(f"dataset {path}: cannot read a `code` column: {type(exc).__name__}: {exc}") from exc


def dataset_row(path: str | Path, row: int | None, folder: Path) -> Path:
    """Write row `row` of a dataset export as a reference file `<dataset>_row<N>.py` in `folder`; its path."""
    codes = dataset_codes(path)
    if row is None or not 0 <= row < len(codes):
        raise TaskError(f"dataset {path} has {len(codes)} rows: pick one with --row 0..{len(codes) - 1}")
    return _write_row(Path(path), row, codes[row], folder)


def dataset_rows(path: str | Path, folder: Path) -> list[Path]:
    """Every row of a dataset export as reference files in `folder` (as `dataset_row` names them), in row order."""
    return [_write_row(Path(path), row, code, folder) for row, code in enumerate(dataset_codes(path))]


def _write_row(path: Path, row: int, code: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{path.stem}_row{row}.py"
    dest.write_text(code)
    return dest


def _int_value(node: ast.AST) -> int | None:
    """The value of an integer literal or constant arithmetic on literals (`1 << 21`, `16 * 1024`), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.LShift)):
        left, right = _int_value(node.left), _int_value(node.right)
        if left is None or right is None or (isinstance(node.op, ast.LShift) and not 0 <= right < 63):
            return None
        ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.FloorDiv: int.__floordiv__,
               ast.LShift: int.__lshift__}
        return ops[type(node.op)](left, right) if not (isinstance(node.op, ast.FloorDiv) and right == 0) else None
    return None


def shape_constants(source: str) -> dict[str, int]:
    """Module-level integer constants that only `get_inputs()` uses (not `Model`, not `get_init_inputs()`).

    Such a constant sizes the inputs but neither the weights nor the computation, so the task also holds at
    other values: the judge checks one extra shape with each of them changed, to catch candidates that hard-code
    the sizes.
    """
    tree = ast.parse(source)
    values = {t.id: v for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name) and (v := _int_value(node.value)) is not None}
    used: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            used[node.name] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    only_inputs = used.get("get_inputs", set()) - used.get("get_init_inputs", set()) - used.get("Model", set())
    return {name: value for name, value in values.items() if name in only_inputs and value > 2}


def extra_shape(constants: dict[str, int]) -> dict[str, int]:
    """The values of the extra-shape check: about half, and odd, so that tails and remainders are exercised."""
    return {name: value // 2 + 1 if (value // 2) % 2 == 0 else value // 2 for name, value in constants.items()}


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
