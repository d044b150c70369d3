"""`task new`: a reference task from the user's own module (a class in a file, or a submodule of a transformers
model folder), checked and written in KernelBench format."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import app, fail, out, writable
from .options import OVERWRITE

task_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Reference tasks from your own modules.")
app.add_typer(task_app, name="task")


@task_app.command("new")
def task_new_cmd(
    spec: Optional[str] = typer.Argument(None, metavar="[FILE.py:CLASS]", help="the class to make a task of"),
    init: str = typer.Option("[]", help="FILE.py:CLASS's constructor arguments, a Python list evaluated in the file's "
                             "namespace, e.g. '[4096, 11008]'"),
    inputs: Optional[str] = typer.Option(None, help="one sample of forward's arguments, a Python list, e.g. "
                                         "'[torch.randn(8, 4096)]'"),
    hf_model: Optional[Path] = typer.Option(None, "--hf-model", help="a transformers model folder (instead of FILE)"),
    submodule: Optional[str] = typer.Option(None, help="with --hf-model: the submodule, e.g. model.layers.0.mlp"),
    sample: Optional[str] = typer.Option(None, help="with --hf-model: text the model runs on once (token ids "
                                         "'1,2,3' for a folder without a tokenizer)"),
    out_file: Path = typer.Option(..., "--out", help="the task file to write"),
    overwrite: bool = OVERWRITE,
) -> None:
    """Write a KernelBench-format task whose Model is your module (its parameter names kept, so your state dict
    loads into the result), after checking that it imports, builds and runs."""
    from ..user_task import UserTaskError, from_file, from_hf

    writable(out_file, "--out", file=True)
    if out_file.exists() and not overwrite:
        fail(f"--out {out_file}: exists (--overwrite replaces it)")
    if (spec is None) == (hf_model is None):
        fail("give FILE.py:CLASS (with --inputs), or --hf-model DIR with --submodule and --sample")
    try:
        if spec is not None:
            path, _, cls = spec.rpartition(":")
            if not path.endswith(".py") or not cls or not Path(path).is_file():
                fail(f"{spec}: expected FILE.py:CLASS with an existing file")
            if inputs is None:
                fail("FILE.py:CLASS needs --inputs (one sample of forward's arguments)")
            made = from_file(Path(path), cls, init, inputs)
        else:
            if not submodule or sample is None:
                fail("--hf-model needs --submodule and --sample")
            if not (hf_model / "config.json").is_file():
                fail(f"--hf-model {hf_model}: no config.json (a transformers model folder?)")
            made = from_hf(hf_model, submodule, sample)
    except UserTaskError as exc:
        fail(str(exc))
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(made.source)
    out.print(f"wrote {out_file}", highlight=False, soft_wrap=True)
    for note in made.notes:
        out.print(f"  {note}", highlight=False, soft_wrap=True, markup=False)
