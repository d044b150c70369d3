"""`export`: a solution for a task as a package your model imports (a `torch.library` op and a drop-in module) and
as a Hugging Face `kernels` build."""

from __future__ import annotations

from pathlib import Path

import typer

from ..backend import BackendError
from ..task import TaskError
from ..workspace.candidate import CandidateError
from .common import app, fail, out, writable
from .options import BACKEND_HELP, Backends, CacheDir


@app.command("export")
def export_cmd(
    solution: Path = typer.Argument(..., metavar="SOLUTION", help="a single .py (ModelNew + load_inline) or a "
                                    "workspace, judged correct for the task"),
    task: Path = typer.Option(..., "--task", help="the task it solves (e.g. from `cuda-agent task new`)"),
    name: str = typer.Option(..., "--name", help="the package's name (a Python identifier, lower case)"),
    out_dir: Path = typer.Option(..., "--out", help="folder for NAME/ (the package) and build/ (the kernels build)"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    cache_dir: CacheDir = None,
) -> None:
    """Export a kernel into your model: NAME/ (import it: the drop-in module has your class's name, constructor and
    parameter names; forward only) and build/<variant>/ (for kernels.get_local_kernel and kernelize)."""
    from ..export import ExportError, export

    writable(out_dir, "--out")
    try:
        done = export(solution, task, name, out_dir, backend, cache_dir)
    except (ExportError, TaskError, CandidateError, BackendError) as exc:
        fail(str(exc))
    out.print(f"wrote {done.package} (import {name}; {name}.{done.class_name} is the drop-in module, "
              f"torch.ops.{done.namespace}.forward the op)", highlight=False, soft_wrap=True)
    for note in done.notes:
        out.print(f"  {note}", highlight=False, soft_wrap=True, markup=False)
