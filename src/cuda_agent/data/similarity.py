"""Python-AST similarity between tasks (the benchmark-leak filter) and operator sequences (near-duplicates).

A task becomes a token sequence: the AST's node types in walk order, with the called or accessed name for calls
and attributes (`Call:Conv2d`, `Attr:relu`) and the type only for constants and variable names, so renaming
variables or changing sizes does not hide a copy. Similarity is difflib's ratio of the two sequences (2M/T:
matching tokens over total), 1.0 for identical structure.

The boilerplate every task shares dominates that sequence (two unrelated two-operator chains score about 0.95), so
near-duplicates inside a dataset are judged on the operator sequence instead: the operators the `Model` class calls,
in source order, lower-cased (`nn.ReLU`, `F.relu` and `torch.relu` are all `relu`). Same sequence, differing only
in sizes, arguments or names: a duplicate.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

from ..pyparse import parse as parse_python


def fingerprint(source: str) -> list[str]:
    tokens = []
    for node in ast.walk(parse_python(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # docstrings
        name = type(node).__name__
        if isinstance(node, ast.Call):
            func = node.func
            name += ":" + (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "?"))
        elif isinstance(node, ast.Attribute):
            name += ":" + node.attr
        elif isinstance(node, ast.Constant):
            name += ":" + type(node.value).__name__
        tokens.append(name)
    return tokens


def operator_sequence(source: str) -> tuple[str, ...]:
    """The operators a task's classes call, in execution order; `self.op(x)` counts as the module built for `op`."""
    calls: list[str] = []
    for cls in parse_python(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        built = {}  # self.<attr> = nn.Something(...) in any method
        for node in ast.walk(cls):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and _is_self(target.value):
                        built[target.attr] = _called(node.value)
        for method in cls.body:
            if isinstance(method, ast.FunctionDef) and method.name != "__init__":
                _CallOrder(built, calls).visit(method)
    return tuple(name.lower() for name in calls)


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "?")


class _CallOrder(ast.NodeVisitor):
    """Post-order: a call's arguments run before it."""

    def __init__(self, built: dict[str, str], out: list[str]):
        self.built, self.out = built, out

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and _is_self(func.value):
            self.out.append(self.built.get(func.attr, func.attr))
        elif _called(node) not in ("super",):
            self.out.append(_called(node))


def similarity(a: list[str], b: list[str]) -> float:
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return matcher.ratio()


class Index:
    """Fingerprints of a suite (e.g. KernelBench levels 1-3) for the maximum similarity of a new task to it."""

    def __init__(self, sources: dict[str, str]):
        self.items = {name: fingerprint(src) for name, src in sources.items()}

    @classmethod
    def from_suite(cls, root: str | Path | None) -> Index:
        if root is None:
            return cls({})
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"suite {root}: no such folder")
        return cls({str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.py"))})

    def max_similarity(self, tokens: list[str]) -> tuple[float, str | None]:
        best, where = 0.0, None
        for name, other in self.items.items():
            matcher = difflib.SequenceMatcher(None, tokens, other, autojunk=False)
            if matcher.real_quick_ratio() <= best or matcher.quick_ratio() <= best:
                continue
            score = matcher.ratio()
            if score > best:
                best, where = score, name
        return best, where

    def add(self, name: str, tokens: list[str]) -> None:
        self.items[name] = tokens
