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


@app.command("check-model")
def check_model_cmd(
    hf_model: Path = typer.Option(..., "--hf-model", help="the transformers model folder"),
    replace: str = typer.Option(..., "--replace", metavar="SUBMODULE=EXPORT", help="submodules to replace (a name "
                                "or a pattern, e.g. 'model.layers.*.mlp') and the package `export` wrote (OUT/NAME)"),
    sample: str = typer.Option(..., help="text the model runs on (token ids '1,2,3' for a folder without a "
                               "tokenizer)"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    fail_on_reject: bool = typer.Option(False, "--fail-on-reject", help="exit 1 when the outputs differ beyond the "
                                        "judge's tolerance"),
) -> None:
    """The whole model with the kernel in, against the model as it is: outputs and time."""
    from ..export.check_model import CheckError, check
    from ..user_task import UserTaskError, sample_ids

    pattern, _, export_dir = replace.partition("=")
    if not pattern or not export_dir:
        fail(f"--replace {replace!r}: expected SUBMODULE=EXPORT_DIR")
    if not (hf_model / "config.json").is_file():
        fail(f"--hf-model {hf_model}: no config.json (a transformers model folder?)")
    try:
        result = check(hf_model, pattern, Path(export_dir), sample_ids(hf_model, sample), backend)
    except (CheckError, UserTaskError, BackendError) as exc:
        fail(str(exc))
    colour = "green" if result.within_tolerance else "red"
    rows = [("replaced", f"{len(result.replaced)}: {', '.join(result.replaced)}"),
            ("outputs", f"[{colour}]{'match' if result.within_tolerance else 'DIFFER'}[/] (max abs difference "
                        f"{result.max_abs_diff:.2e}; atol = rtol = 1e-2)"),
            ("vs fp64", f"original {result.error_vs_fp64['original']:.2e}, replaced "
                        f"{result.error_vs_fp64['replaced']:.2e} (max abs error of the logits)"),
            ("time (us)", f"original {result.time_us['original']:.1f}, replaced {result.time_us['replaced']:.1f}: "
                          f"{result.speedup:.2f}x (the judge's timing loop, median)")]
    for label, value in rows:
        out.print(f"  {label:<10} {value}", highlight=False, soft_wrap=True)
    if fail_on_reject and not result.within_tolerance:
        raise typer.Exit(1)
