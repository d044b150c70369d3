"""A reference task in KernelBench format: `class Model`, `get_inputs()`, `get_init_inputs()`.

The judge's process only parses the file (and finds the modules its top level imports); it is imported and run in
the reference worker, which reports import and run failures back as `TaskError`s (a broken reference is the user's
error, not the candidate's).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator

from .pyparse import parse as parse_python

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
        tree = parse_python(source, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise TaskError(f"reference {path}: cannot parse: {exc}") from exc
    defined = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    defined |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    missing = [name for name in REQUIRED if name not in defined]
    if missing:
        raise TaskError(f"reference {path}: missing {', '.join(missing)} (KernelBench format needs "
                        "class Model, get_inputs() and get_init_inputs())")
    absent = _absent_modules(tree, path.parent)
    if absent:  # said now, not after the candidate's build, when the reference worker fails to import it
        raise TaskError(f"reference {path}: imports {absent[0]}, which is not installed here")
    return Task(path=path.resolve(), source=source)


def _absent_modules(tree: ast.Module, folder: Path) -> list[str]:
    """The top-level modules the reference imports at its top level that neither Python nor its folder has."""
    names = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module and not node.level]
    roots = dict.fromkeys(name.split(".")[0] for name in names)
    return [root for root in roots if importlib.util.find_spec(root) is None
            and not (folder / f"{root}.py").exists() and not (folder / root).is_dir()]


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


def _int_value(node: ast.AST, names: dict[str, int] | None = None) -> int | None:
    """The value of an integer literal or constant arithmetic on literals (`1 << 21`, `16 * 1024`) and on `names`
    (`H * W`), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and names is not None:
        return names.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.LShift)):
        left, right = _int_value(node.left, names), _int_value(node.right, names)
        if left is None or right is None or (isinstance(node.op, ast.LShift) and not 0 <= right < 63):
            return None
        ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.FloorDiv: int.__floordiv__,
               ast.LShift: int.__lshift__}
        return ops[type(node.op)](left, right) if not (isinstance(node.op, ast.FloorDiv) and right == 0) else None
    return None


SLOT = "_cuda_agent_size_"  # a size written as a literal in get_inputs(), named so that it can change
SIZED = {"randn": "all", "rand": "all", "zeros": "all", "ones": "all", "empty": "all", "full": "first",
         "randint": "last"}  # torch's constructors: which positional arguments are sizes


def _module_bindings(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    """(name, expression) of each module-level assignment to a name, in order (`B, D = 16, 4096`: two)."""
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                yield target.id, node.value
            elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(node.value, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(node.value.elts):
                yield from ((name.id, value) for name, value in zip(target.elts, node.value.elts)
                            if isinstance(name, ast.Name))


def _module_ints(tree: ast.Module) -> dict[str, int]:
    """Module-level names bound to integers: `N = 1 << 21`, `B, D = 16, 4096`, `M = K = 512`, `N = H * W`."""
    values: dict[str, int] = {}
    for name, expression in _module_bindings(tree):
        if (value := _int_value(expression, values)) is not None:
            values[name] = value
    return values


def _module_derived(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level integers computed from other ones (`N = H * W`): their expressions, which `get_inputs` reads in
    their place (`enable_sizes`), so that a size changed by the extra shape changes what is computed from it."""
    values: dict[str, int] = {}
    derived: dict[str, ast.expr] = {}
    for name, expression in _module_bindings(tree):
        derived.pop(name, None)
        if (value := _int_value(expression, values)) is not None:
            values[name] = value
            if any(isinstance(n, ast.Name) for n in ast.walk(expression)):
                derived[name] = expression
    return derived


def _inline(node: ast.AST, derived: dict[str, ast.expr]) -> ast.AST:
    """`node` with every read of a derived module-level integer replaced by its expression (recursively)."""
    local = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    class Inline(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.AST:
            if isinstance(name.ctx, ast.Load) and name.id in derived and name.id not in local:
                return ast.copy_location(self.visit(copy.deepcopy(derived[name.id])), name)
            return name

    return Inline().visit(copy.deepcopy(node))


def _local_sizes(function: ast.FunctionDef) -> list[ast.Constant]:
    """Integer literals bound to local names of `function` that size a tensor it builds (`n = 4096` then
    `torch.randn(n)`)."""
    sizing = {node.id for call in _sized_calls(function) for arg in _size_args(call)
              for node in (arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg]) if isinstance(node, ast.Name)}
    return [node.value for node in ast.walk(function) if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and node.targets[0].id in sizing
            and isinstance(node.value, ast.Constant) and type(node.value.value) is int and node.value.value > 2]


def _module_int_sequences(tree: ast.Module) -> dict[str, int]:
    """The integers of module-level tuples and lists (`input_shape = (16, 4096)`), keyed `input_shape[1]`."""
    found: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List)):
            for target in (t for t in node.targets if isinstance(t, ast.Name)):
                found |= {f"{target.id}[{i}]": v for i, e in enumerate(node.value.elts)
                          if (v := _int_value(e)) is not None}
    return found


def _sized_calls(function: ast.FunctionDef) -> list[ast.Call]:
    return [call for call in ast.walk(function) if isinstance(call, ast.Call) and SIZED.get(
        call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", ""))]


def _size_args(call: ast.Call) -> list[ast.expr]:
    """The arguments of one of torch's constructors that are sizes (a new list: the tree stays)."""
    which = SIZED[call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id]
    args = {"all": call.args, "first": call.args[:1], "last": call.args[-1:]}[which]
    return [*args, *(kw.value for kw in call.keywords if kw.arg == "size")]


def _size_literals(function: ast.FunctionDef) -> list[ast.Constant]:
    """Integer literals that size a tensor built in `function` (`torch.randn(16, 4096)`, `torch.rand((8, 64))`),
    directly or through a local name (`_local_sizes`)."""
    found = [node for call in _sized_calls(function) for arg in _size_args(call)
             for node in (arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg])
             if isinstance(node, ast.Constant) and type(node.value) is int and node.value > 2]
    return found + _local_sizes(function)


def _get_inputs(tree: ast.Module) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_inputs"), None)


def _slot(node: ast.Constant) -> str:
    return f"{SLOT}line{node.lineno}_col{node.col_offset}"


def shape_constants(source: str) -> dict[str, int]:
    """The sizes of the task's inputs that can change without changing its weights or its computation: module-level
    integers (also from tuple assignments) that only `get_inputs()` uses (not `Model`, not `get_init_inputs()`), the
    integers of such tuples and lists (`input_shape = (4096,)`: `input_shape[0]`), and integer literals sizing the
    tensors `get_inputs()` builds, keyword sizes too (named `SLOT...`; `enable_sizes` lets them change).

    The judge checks one extra shape with them changed, to catch candidates that hard-code the sizes (the reference
    worker keeps those at which the task itself still runs: `fit_sizes`).
    """
    tree = parse_python(source)
    values, derived = _module_ints(tree), _module_derived(tree)
    used: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):  # (a derived integer read: the names it is made of)
            used[node.name] = {n.id for n in ast.walk(_inline(node, derived)) if isinstance(n, ast.Name)}
    only_inputs = used.get("get_inputs", set()) - used.get("get_init_inputs", set()) - used.get("Model", set())
    named = {name: value for name, value in values.items() if name in only_inputs and value > 2
             and name not in derived}
    named |= {key: value for key, value in _module_int_sequences(tree).items()
              if key.split("[")[0] in only_inputs and value > 2}
    function = _get_inputs(tree)
    literals = {_slot(node): node.value for node in _size_literals(function)} if function else {}
    return {**named, **literals}


def enable_sizes(module: ModuleType, source: str) -> None:
    """Rewrite the imported task's `get_inputs` so that each size literal reads a module attribute of its own (with
    its literal value), and each module-level integer computed from others (`N = H * W`) is computed again from
    them: the extra-shape check can then change them like named constants. Nothing else changes."""
    tree = parse_python(source)
    function = _get_inputs(tree)
    if function is None:
        return
    derived = _module_derived(tree)
    literals = {id(node): node for node in _size_literals(function)}
    if not literals and not derived:
        return

    class Named(ast.NodeTransformer):
        def visit_Constant(self, node: ast.Constant) -> ast.AST:
            if id(node) not in literals:
                return node
            setattr(module, _slot(node), node.value)
            return ast.copy_location(ast.Name(id=_slot(node), ctx=ast.Load()), node)

    function = _inline(Named().visit(function), derived)
    rewritten = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    exec(compile(rewritten, getattr(module, "__file__", None) or "<task>", "exec"), vars(module))


def describe_sizes(shapes: dict[str, int], source: str) -> str:
    """`N=1048577, get_inputs line 12: 4096->2049` for an extra shape's label."""
    function = _get_inputs(parse_python(source))
    literals = {_slot(node): node for node in (_size_literals(function) if function else [])}
    return ", ".join(f"get_inputs line {literals[k].lineno}: {literals[k].value}->{v}" if k in literals else f"{k}={v}"
                     for k, v in shapes.items())


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


def task_files(data: Path, folder: Path) -> list[Path]:
    """Task files from a reference .py, a folder of them (of a KernelBench-layout suite: its levelN folders only,
    not e.g. examples/solutions) or a dataset export."""
    from .suite.evaluate import discover

    if data.is_dir():
        try:
            tasks = [t.path for t in discover(data)]
        except FileNotFoundError:  # no levelN folders (or no tasks in them): every .py below
            tasks = sorted(p for p in data.rglob("*.py") if not p.name.startswith("_"))
    elif data.suffix in DATASET_SUFFIXES:
        tasks = dataset_rows(data, folder)
    elif data.suffix == ".py" and data.is_file():
        tasks = [data]
    else:
        raise TaskError(f"{data}: not a task file, a folder of them or a dataset (.parquet, .jsonl)")
    if not tasks:
        raise TaskError(f"{data} holds no tasks")
    return tasks
