"""`data seeds` and `data build`: the fused-operator training set."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from ..backend import BackendError
from .common import app, err, fail, fresh_folder, out, writable
from .progress import Progress
from .options import OVERWRITE, TEMPERATURE, Backends

data_app = typer.Typer(add_completion=False, no_args_is_help=True, help="The fused-operator training set.")
app.add_typer(data_app, name="data")


@data_app.command("seeds")
def data_seeds_cmd(
    out_dir: Path = typer.Option(..., "--out", help="output folder"),
    transformers: bool = typer.Option(True, help="include transformers operators (needs the package)"),
    overwrite: bool = OVERWRITE,
) -> None:
    """Write every crawled operator alone as a KernelBench task, and catalog.json (what could not be used, why)."""
    writable(out_dir, "--out")
    fresh_folder(out_dir, "--out", overwrite, resumes="catalog.json")
    from ..data.seeds import write_seeds

    try:
        catalog = write_seeds(out_dir, transformers)
    except ImportError as exc:
        fail(f"{exc}: pip install transformers, or pass --no-transformers")
    for source, found in catalog.items():
        if found is not None:
            out.print(f"{source}: {len(found['operators'])} seed tasks in {out_dir / source}, "
                      f"{len(found['not_instantiated'])} not instantiated (catalog.json)", highlight=False,
                      soft_wrap=True)


@data_app.command("build")
def data_build_cmd(
    target: int = typer.Option(..., "--target", min=1, help="tasks to keep"),
    out_dir: Path = typer.Option(..., "--out", help="output folder (rerun with the same folder to resume)"),
    backend: Backends = typer.Option("cuda", help="device the filters run and time on: cuda or cpu"),
    kernelbench: Optional[Path] = typer.Option(None, help="KernelBench problems for the similarity filter "
                                               "(e.g. ../shared/kernelbench); without it the filter is not applied"),
    window_ms: str = typer.Option("1,100", help="eager runtime window in ms, LO,HI"),
    workers: int = typer.Option(2, min=1, help="parallel worker processes"),
    seed: int = typer.Option(0, help="seed of candidate 0 (candidate k uses seed + k)"),
    compile_filter: bool = typer.Option(True, "--compile/--no-compile", help="the torch.compile agreement filter "
                                        "(--no-compile: faster, weaker)"),
    memory_gb: float = typer.Option(8.0, "--memory-gb", min=0.1, help="cuda: GPU memory per worker; BATCH is sized "
                                    "to fit"),
    max_attempts: Optional[int] = typer.Option(None, min=1, help="give up after this many attempts (default 20 x "
                                               "target)"),
    time_limit: Optional[float] = typer.Option(None, min=1.0, help="seconds: then finish the running attempts and "
                                               "export (rerun to continue)"),
    transformers: bool = typer.Option(True, help="add transformers operators as standalone tasks (needs the "
                                      "transformers package; --no-transformers for torch operators only)"),
    composer: Literal["offline", "llm"] = typer.Option("offline", help="offline (no model) or llm (an "
                                                       "OpenAI-compatible endpoint; its code runs only in the "
                                                       "sandbox)"),
    model: Optional[str] = typer.Option(None, "--model", help="model for --composer llm"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="endpoint for --composer llm "
                                           "(key from $OPENAI_API_KEY)"),
    temperature: float = TEMPERATURE,
    max_tokens: int = typer.Option(4096, min=1, help="tokens per reply of the LLM composer"),
    family: Literal["all", "expert"] = typer.Option("all", help="all operators, or expert: only tasks the expert "
                                                    "fuses (pointwise chains, row reductions; torch operators only)"),
    held_out: float = typer.Option(0.0, "--held-out", min=0.0, max=0.99, help="share of operator combinations "
                                   "in the held-out split (splits/held_out.jsonl)"),
    unseen_ops: str = typer.Option("", "--unseen-ops", help="operators (catalog names, e.g. nn.Mish,F.mish) whose "
                                   "tasks go only to splits/unseen_op.jsonl"),
    unseen_shapes: int = typer.Option(0, "--unseen-shapes", min=0, help="train tasks re-sized to an odd row "
                                      "length into splits/unseen_shape.jsonl"),
    overwrite: bool = OVERWRITE,
) -> None:
    """Compose fused tasks, filter them, deduplicate, export parquet + jsonl (with splits/) and a stats report."""
    writable(out_dir, "--out")
    fresh_folder(out_dir, "--out", overwrite, resumes="attempts.jsonl")
    from ..llm import LLMError, OpenAIClient
    from ..data.build import BuildConfig, Builder, LLMComposer
    from ..data.filters import FilterConfig

    llm = None
    if composer == "llm":
        if not model:
            fail("--composer llm needs --model (and --base-url for a local server)")
        try:
            OpenAIClient(model, base_url).check()
        except LLMError as exc:
            fail(f"endpoint {base_url or 'api.openai.com'} unusable: {exc}")
        llm = LLMComposer(model, base_url, temperature, max_tokens)

    try:
        lo, hi = (float(x) for x in window_ms.split(","))
    except ValueError:
        fail(f"--window-ms must be LO,HI in milliseconds, got '{window_ms}'")
    try:
        from ..backend import get_backend

        get_backend(backend).check_toolchain()  # no GPU here: one line, as every command says it
    except BackendError as exc:
        fail(str(exc))
    if transformers and family == "all":
        try:
            import transformers as _  # noqa: F401
        except ImportError:
            fail("transformers is not installed: pip install transformers, or pass --no-transformers")
    cfg = BuildConfig(target, out_dir, FilterConfig(device=backend, window_ms=(lo, hi), check_compile=compile_filter,
                                                   memory_budget_gb=memory_gb),
                      kernelbench=kernelbench, workers=workers, seed=seed, composer=llm,
                      max_attempts=max_attempts, time_limit_s=time_limit, transformers=transformers, family=family,
                      held_out=held_out, unseen_shapes=unseen_shapes,
                      unseen_ops=tuple(op.strip() for op in unseen_ops.split(",") if op.strip()))
    try:
        builder = Builder(cfg)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    with Progress(err, every_s=10) as progress:
        bar, counted = progress.add("kept", total=target, completed=builder.kept_count()), [builder.kept_count()]

        def on_attempt(kept: int, tried: int, rec: dict | None) -> None:
            why = "kept" if rec and rec["kept"] else next((c["name"] for c in (rec or {}).get("checks", [])
                                                          if not c["passed"]), "")
            progress.advance(bar, f"{tried} tried; last {why}", steps=kept - counted[0])
            counted[0] = kept

        stats = builder.run(on_attempt)
    out.print((out_dir / "stats.md").read_text())
    if stats["kept"] < target:
        err.print(f"[yellow]{stats['kept']} of {target} tasks after {stats['attempts']} attempts[/]")
    out.print("written:", highlight=False, soft_wrap=True)
    for name in ("dataset.parquet", "dataset.jsonl", "splits", "stats.json", "stats.md", "attempts.jsonl"):
        out.print(f"  {out_dir / name}", highlight=False, soft_wrap=True)

