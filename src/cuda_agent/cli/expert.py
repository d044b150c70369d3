"""`train expert`: the expert's episodes (rl/expert) on a task set, as run folders that `train --stage rft` reads."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import typer

from ..backend import BackendError
from ..task import TaskError
from . import common
from .common import err, fail, integers, out, warn_unsandboxed, writable
from .options import BACKEND_HELP, Backends
from .progress import Progress
from ..task import task_files
from .train import train_app


@train_app.command("expert")
def train_expert_cmd(
    data: Path = typer.Option(..., help="tasks: a reference .py, a folder of them or a dataset (.parquet, .jsonl)"),
    out_dir: Path = typer.Option(..., "--out", help="folder of run folders OUT/TASK/SHAPE-K and episodes.jsonl "
                                 "(rerun to resume)"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    shapes: str = typer.Option("direct,improve,fix,repair", help="episode shapes, comma-separated: direct (write, "
                               "verify, profile, finish), improve (slow knobs, profile, faster ones, profile), fix (a "
                               "planted build error, verify, edit, verify), repair (a planted wrong value, verify, "
                               "the kernel written again, verify, profile)"),
    per_task: int = typer.Option(1, "--per-task", min=1, help="episodes of each shape per task"),
    parallel: int = typer.Option(1, min=1, help="episodes played at once"),
    compact: bool = typer.Option(False, "--compact/--full-tools", help="the compact tool set and prompt (as a "
                                 "model trained with --compact sees them)"),
    gpus: Optional[str] = typer.Option(None, help="judge GPUs, e.g. 0,1"),
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache (builds, baselines)"),
) -> None:
    """Play the kernel-writing expert on every task it can fuse, through the real environment and judge."""
    from ..rl.expert.episodes import SHAPES, play_expert

    writable(out_dir, "--out")
    writable(cache_dir, "--cache-dir")
    chosen = tuple(s.strip() for s in shapes.split(",") if s.strip())
    unknown = sorted(set(chosen) - set(SHAPES))
    if unknown or not chosen:
        fail(f"--shapes: unknown {', '.join(unknown) or '(none given)'} (choose from {', '.join(SHAPES)})")
    try:
        from ..judge.pool import JudgePool

        tasks = task_files(data, out_dir / "tasks")
        with JudgePool(backend, common.config(cache_dir), devices=integers(gpus, "--gpus")) as pool, \
                Progress(err, every_s=10) as progress:
            warn_unsandboxed(pool)
            each = len(chosen) * per_task
            bar = progress.add("episodes", total=len(tasks) * each)
            log = lambda m: progress.advance(bar, m, steps=each if ": skipped (" in m else 1)  # noqa: E731
            episodes, skipped = play_expert(pool, tasks, out_dir, chosen, per_task, parallel, log, compact)
    except (TaskError, BackendError, ValueError) as exc:
        fail(str(exc))
    rewards = Counter(f"{e.reward:g}" for e in episodes)
    out.print(f"{len(episodes)} episode(s) on {len(tasks) - len(skipped)} of {len(tasks)} tasks in {out_dir} "
              f"(rewards: {', '.join(f'{k}: {v}' for k, v in sorted(rewards.items())) or 'none'}); "
              f"{len(skipped)} task(s) the expert cannot fuse ({out_dir / 'skipped.json'})", highlight=False,
              soft_wrap=True)
    if not episodes:
        fail("no episodes: the expert fuses none of these tasks")
