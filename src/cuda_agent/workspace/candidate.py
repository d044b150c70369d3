"""A candidate solution, in one of two formats, reduced to the files the judge will use.

- `workspace`: the CUDA-Agent layout. Only `model_new.py` and `kernels/*` are taken; the fixed `binding.cpp`,
  `binding_registry.h`, `utils/` and `model.py` are the judge's own and never read from the candidate.
- `single_file`: a KernelBench `.py` defining `ModelNew`, building its kernels with `load_inline`.

The files are read into memory once, so later edits to the candidate's folder cannot change what is judged.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ..pyparse import parse as parse_python

KERNEL_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp", ".inl")
MAX_FILE_BYTES = 4 * 2**20
MAX_TOTAL_BYTES, MAX_FILES = 32 * 2**20, 256  # a workspace's kernels together


class CandidateError(ValueError):
    """The candidate path does not exist or is not a recognisable candidate."""


@dataclass(frozen=True)
class Candidate:
    kind: str  # "workspace" | "single_file"
    origin: Path
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> content

    @property
    def hash(self) -> str:
        h = hashlib.sha256(self.kind.encode())
        for rel in sorted(self.files):
            h.update(rel.encode() + b"\0" + hashlib.sha256(self.files[rel]).digest())
        return h.hexdigest()

    def text(self) -> dict[str, str]:
        return {rel: data.decode(errors="replace") for rel, data in self.files.items()}

    def missing_model_new(self) -> str | None:
        """Why the judge could not import ModelNew from model_new.py, seen without running it: no such file, a
        syntax error (placed in the file the user wrote), no ModelNew defined (None: defined, or not decidable
        statically)."""
        if "model_new.py" not in self.files:
            return "no model_new.py in the workspace (it must define ModelNew)"
        where = self.origin.name if self.kind == "single_file" else "model_new.py"
        try:
            tree = parse_python(self.files["model_new.py"], filename=where)
        except SyntaxError as exc:
            return f"syntax error: {where} line {exc.lineno}: {exc.msg}; nothing was built"
        except ValueError:  # null bytes: the import says so
            return None
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == "ModelNew":
                return None
            if isinstance(node, ast.Name) and node.id == "ModelNew" and isinstance(node.ctx, ast.Store):
                return None
            if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    (alias.asname or alias.name) == "ModelNew" or alias.name == "*" for alias in node.names):
                return None
        return f"{where} defines no ModelNew (the judge imports ModelNew from it); nothing was built"

    def write_to(self, root: Path) -> None:
        for rel, data in self.files.items():
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)


def load_candidate(path: str | Path) -> Candidate:
    path = Path(path)
    if path.is_file():
        if path.suffix != ".py":
            raise CandidateError(f"candidate {path}: a single-file solution must be a .py file")
        return Candidate("single_file", path.resolve(), {"model_new.py": _read(path)})
    if path.is_dir():
        root = path.resolve()
        files = {}
        if (root / "model_new.py").is_file():
            files["model_new.py"] = _read(root / "model_new.py", root)
        kernels = root / "kernels"
        if kernels.is_symlink():  # another candidate's kernels would be judged as this one's
            raise CandidateError(f"candidate {path}: kernels/ is a symbolic link; copy the files instead")
        if kernels.is_dir():
            found = [f for f in sorted(kernels.rglob("*")) if f.suffix in KERNEL_SUFFIXES and f.is_file()]
            if len(found) > MAX_FILES or sum(f.stat().st_size for f in found) > MAX_TOTAL_BYTES:
                raise CandidateError(f"candidate {path}: {len(found)} kernel files, more than {MAX_FILES} files or "
                                     f"{MAX_TOTAL_BYTES // 2**20} MiB together")
            for f in found:
                rel = str(f.relative_to(root))
                if not rel.isprintable() or rel != rel.encode("utf-8", "replace").decode("utf-8"):
                    raise CandidateError(f"candidate file {rel!r}: a file name must be printable UTF-8")
                files[rel] = _read(f, root)
        return Candidate("workspace", root, files)
    raise CandidateError(f"candidate {path}: no such file or folder")


def _read(path: Path, root: Path | None = None) -> bytes:
    """A candidate's file; one of a workspace (`root`, resolved) must lie in it with no link on the way."""
    if path.is_symlink() or root and path.resolve() != path:
        # a link could make the judge read (and build in) a file outside the candidate: another one's kernels
        raise CandidateError(f"candidate file {path} is a symbolic link or lies in a linked folder; "
                             "copy the file instead")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise CandidateError(f"candidate file {path} is larger than {MAX_FILE_BYTES // 2**20} MiB")
    return path.read_bytes()
