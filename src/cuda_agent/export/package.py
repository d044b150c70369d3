"""`cuda-agent export`: a solution for a task as a package the user's model imports, and as a Hugging Face `kernels`
build (issue 34).

The package (`OUT/NAME/`): `_task.py` (the task), `_model_new.py` (the solution's `ModelNew`), `_ext/` (its
extensions, built here: a workspace's binding by the judge's builder, a single file's `load_inline` calls by torch,
recorded as they return), `_runtime.py` (runtime.py) and `__init__.py`, which names the custom op
(`torch.ops.<namespace>.forward`) and the drop-in module (the reference class's name). The `kernels` build
(`OUT/build/<variant>/`): the same files, `layers.py` (the layer `kernelize` swaps in, named NAME) and
`metadata.json` with the files' digests; the variant (`torch213-cxx11-cpu-x86_64-linux`, ...) is this machine's
torch, ABI, backend, CPU and OS. Before anything is written the solution's `ModelNew` must hold the reference's
parameter names (the user's state dict goes into the drop-in module unchanged), and after, the package is imported
and its module must give the reference's outputs on the task's inputs. The solution's code (a single file's import,
the package's check) runs only in a process of its own, sandboxed (`isolated.py`), never in this one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..backend import get_backend
from ..judge.config import default_cache_dir
from ..task import import_file, load_task
from ..workspace.build import EXTENSION_NAME, Builder
from ..workspace.candidate import load_candidate
from . import isolated

RUNTIME = Path(__file__).with_name("runtime.py")


class ExportError(ValueError):
    """The solution cannot be exported for the task; the message says why."""


@dataclass
class Exported:
    package: Path
    hub: Path
    namespace: str
    class_name: str
    notes: list[str] = field(default_factory=list)


def variant(backend: str) -> str:
    """This machine's `kernels` build variant for `backend`."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    abi = "cxx11" if torch._C._GLIBCXX_USE_CXX11_ABI else "cxx98"
    device = "cpu" if backend == "cpu" else f"cu{''.join(torch.version.cuda.split('.')[:2])}"
    return f"torch{major}{minor}-{abi}-{device}-{platform.machine()}-{platform.system().lower()}"


def export(solution: Path, task_path: Path, name: str, out: Path, backend: str, cache_dir: Path | None = None
           ) -> Exported:
    """Export `solution` for the task at `task_path` as NAME under `out` (a workspace builds with the judge's
    cached objects in `cache_dir`, default the judge's)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ExportError(f"--name {name!r}: a Python package name (lower case letters, digits, _)")
    task, cand = load_task(task_path), load_candidate(solution)
    missing = cand.missing_model_new()
    if missing:
        raise ExportError(missing)
    digest = hashlib.sha256((task.hash + cand.hash + backend).encode()).hexdigest()[:10]
    namespace = f"cuda_agent_{name}_{digest}"
    reference = import_file(task.path, f"cuda_agent_export_task_{digest}")
    init, inputs = list(reference.get_init_inputs()), list(reference.get_inputs())
    model = reference.Model(*init).eval()
    names = list(model.state_dict())
    with torch.no_grad():
        expected = model(*inputs)
    class_name = type(model).__mro__[1].__name__ if type(model).__name__ == "Model" and \
        type(model).__mro__[1] is not torch.nn.Module else "Model"
    with tempfile.TemporaryDirectory(prefix="cuda-agent-export-") as tmp:
        staged = Path(tmp) / name
        (staged / "_ext").mkdir(parents=True)
        cache = Path(cache_dir or default_cache_dir())
        extensions = _build(cand, backend, staged / "_ext", Path(tmp), cache)
        (staged / "_model_new.py").write_text(cand.text()["model_new.py"] if cand.kind == "workspace"
                                              else cand.origin.read_text())
        (staged / "_task.py").write_text(task.source)
        shutil.copyfile(RUNTIME, staged / "_runtime.py")
        (staged / "__init__.py").write_text(_init(name, task.name, namespace, names, _schema(inputs, expected),
                                                  extensions, class_name))
        exported = Exported(out / name, out / "build" / variant(backend), namespace, class_name)
        exported.notes += isolated.run("check", {"staged": str(staged), "name": name, "task": str(task.path),
                                                 "names": names, "device": get_backend(backend).device},
                                       Path(tmp), [task.path.parent], [cache])["notes"]
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(exported.package, ignore_errors=True)
        shutil.copytree(staged, exported.package, ignore=shutil.ignore_patterns("__pycache__"))
    _hub(exported, name, backend, digest)
    return exported


def _build(cand, backend: str, into: Path, tmp: Path, cache_dir: Path) -> list[str]:
    """The solution's extensions built into `into`; the names a workspace's `model_new.py` imports."""
    if cand.kind == "workspace":
        built = Builder(get_backend(backend), cache_dir / "build").build(cand, tmp / "build")
        if not built.ok:
            raise ExportError(f"the workspace does not build: {built.error}")
        shutil.copyfile(built.module_path, into / built.module_path.name)
        return [EXTENSION_NAME]
    isolated.run("build-inline", {"origin": str(cand.origin), "digest": cand.hash[:10],
                                  "extensions": str(tmp / "extensions"), "into": str(into)},
                 tmp, [cand.origin.parent], [cache_dir])
    return []


def build_inline_here(origin: str, digest: str, extensions: str, into: str) -> list[str]:
    """(In the solution's own process) a single file imported, its `load_inline` libraries copied into `into`."""
    import torch.utils.cpp_extension as cpp_extension

    real, made = cpp_extension.load_inline, []

    def recording(*args, **kwargs):
        module = real(*args, **kwargs)
        made.append(Path(module.__file__))
        return module

    os.environ["TORCH_EXTENSIONS_DIR"] = extensions
    cpp_extension.load_inline = recording
    try:
        import_file(origin, f"cuda_agent_export_solution_{digest}")
    except Exception as exc:
        raise ExportError(f"the solution does not import: {type(exc).__name__}: {exc}") from exc
    for path in made:
        shutil.copyfile(path, Path(into) / path.name)
    return [path.name for path in made]


def _schema(inputs: list, expected) -> str:
    kinds = {bool: "bool", int: "SymInt", float: "float"}
    args = []
    for i, x in enumerate(inputs):
        kind = "Tensor" if isinstance(x, torch.Tensor) else kinds.get(type(x))
        if kind is None:
            raise ExportError(f"input {i} is a {type(x).__name__}: the op takes tensors, ints, floats and bools")
        args.append(f"{kind} x{i}")
    if isinstance(expected, torch.Tensor):
        result = "Tensor"
    elif isinstance(expected, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in expected):
        result = f"({', '.join('Tensor' for _ in expected)})"
    else:
        raise ExportError("Model returns something other than a tensor or a tuple of tensors")
    return f"({', '.join(args + ['Tensor[] weights', 'int handle'])}) -> {result}"


def _init(name: str, task: str, namespace: str, names: list[str], schema: str, extensions: list[str],
          class_name: str) -> str:
    return "\n".join([
        f'"""{name}: a kernel for {task}, exported by cuda-agent (forward only).',
        "",
        f"`{class_name}`: the drop-in module (the original's constructor and parameter names);",
        f"`forward`: the custom op, also `torch.ops.{namespace}.forward`.",
        '"""', "", "from pathlib import Path", "", "from ._runtime import Export", "",
        f"_export = Export(Path(__file__).parent, __name__, {namespace!r}, {names!r},",
        f"                 {schema!r}, {extensions!r}, {class_name!r})",
        "forward = _export.op", f"{class_name} = _export.module", ""])


def check_here(staged: str, name: str, task: str, names: list[str], device: str) -> list[str]:
    """(In the solution's own process) the staged package imported: ModelNew holds the reference's parameter names,
    and the drop-in module with the reference's weights gives the reference's outputs on the task's inputs on the
    backend's device. Its notes."""
    reference_task = import_file(task, f"cuda_agent_export_check_task_{name}")
    init, inputs = list(reference_task.get_init_inputs()), list(reference_task.get_inputs())
    package = import_file(Path(staged) / "__init__.py", f"cuda_agent_export_check_{name}")
    export = package._export
    theirs = list(export.model_new(*init).state_dict())
    if sorted(theirs) != sorted(names):
        raise ExportError(f"ModelNew's parameters ({', '.join(theirs) or 'none'}) are not Model's "
                          f"({', '.join(names) or 'none'}): the drop-in module could not take the user's state dict")
    module = export.module(*init).eval()
    reference = export.task.Model(*init)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in reference.state_dict().values():
            if p.is_floating_point():
                p.copy_(torch.randn_like(p) * 0.1)
    module.load_state_dict(reference.state_dict(), strict=True)
    module, reference = module.to(device), reference.to(device)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    with torch.no_grad():
        got, want = module(*inputs), reference(*inputs)
    pairs = list(zip(got, want)) if isinstance(want, (tuple, list)) else [(got, want)]
    if not all(torch.allclose(g, w, atol=1e-2, rtol=1e-2) for g, w in pairs):
        raise ExportError("the exported module's outputs differ from the reference's on the task's inputs")
    return [f"the drop-in {export.module.__name__} takes the reference's state dict ({len(names)} tensors) and "
            f"gives its outputs on the task's inputs (atol = rtol = 1e-2)"]


def _hub(exported: Exported, name: str, backend: str, digest: str) -> None:
    """The `kernels` build: the package's files, layers.py and metadata.json (with each file's digest)."""
    root = exported.hub
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(exported.package, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "layers.py").write_text(f'"""The layer `kernels.kernelize` swaps in (forward only)."""\n\n'
                                    f"from . import _export\n\n{name} = _export.layer()\n")
    with (root / "__init__.py").open("a") as init:
        init.write("from . import layers  # noqa: E402  (for kernelize)\n")
    files = {p.relative_to(root).as_posix(): base64.b64encode(hashlib.sha256(p.read_bytes()).digest()).decode()
             for p in sorted(root.rglob("*")) if p.is_file()}
    metadata = {"name": name.replace("_", "-"), "id": f"_{name}_{backend}_{digest}", "version": 1,
                "license": "Apache-2.0", "python-depends": [], "backend": {"type": backend},
                "digest": {"algorithm": "sha256", "files": files}}
    (root / "metadata.json").write_text(json.dumps(metadata, indent=2))
    exported.notes.append(f"kernels build {root} (variant {root.name})")
