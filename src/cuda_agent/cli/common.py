"""The command line's shared parts: the app every command group registers on, the consoles, failures and progress,
and the judge or pool a command's options make (`config`: JudgeConfig's fields, its defaults)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..backend import BackendError
from ..judge.config import JudgeConfig
from ..judge.verdict import Verdict
from ..suite.revisions import describe
from .options import EXIT_USAGE
from .program import App

app = App(add_completion=False, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]},
          help="Verified CUDA kernels faster than torch.compile: judge, agent, data, training.")
err = Console(stderr=True)
out = Console()


def _conventional_help() -> None:
    """typer 0.2x writes a required argument as {NAME} in usage lines and tags flags with <bool>; users of pytest,
    vllm and huggingface-cli expect NAME and bare flags (an older or newer typer without these hooks: unchanged)."""
    from typer import core

    if hasattr(core.TyperArgument, "_usage_display_name"):
        core.TyperArgument._usage_display_name = lambda self: (
            self.display_name_raw if self.required else f"[{self.display_name_raw}]") + ("..." if self.nargs != 1
                                                                                      else "")
    shown = getattr(core.TyperOption, "display_type_rich", None)
    if shown is not None:
        core.TyperOption.display_type_rich = lambda self, ctx: None if self.is_flag else shown(self, ctx)


_conventional_help()


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        out.print(f"cuda-agent {__version__}", highlight=False, soft_wrap=True)
        raise typer.Exit()


class _LogLines(logging.Handler):
    """The package's log (e.g. the one-time precompiled-header build, announced with its size) as stderr lines."""

    def emit(self, record: logging.LogRecord) -> None:
        err.print(record.getMessage(), highlight=False, soft_wrap=True, markup=False)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="print the version and exit")) -> None:
    """Verified CUDA kernels faster than torch.compile: judge, agent, data, training."""
    log = logging.getLogger("cuda_agent")
    if not any(isinstance(h, _LogLines) for h in log.handlers):
        log.addHandler(_LogLines())
        log.setLevel(logging.INFO)


def config(cache_dir: Optional[Path], trials: int = JudgeConfig.num_trials, seed: Optional[int] = None,
            **settings):
    """A JudgeConfig from the command's options (`settings` are JudgeConfig fields)."""
    from ..judge import JudgeConfig

    if trials < 1:
        raise BackendError("--trials must be at least 1")
    config = JudgeConfig(num_trials=trials, **settings)
    if seed is not None:
        config.seeds = tuple(seed + i for i in range(trials))
    if cache_dir is not None:
        config.cache_dir = cache_dir
    return config


def warn_unsandboxed(judge) -> None:
    """`auto` fell back to plain processes: say so loudly (a Judge or a JudgePool)."""
    from .. import sandbox

    if not judge.sandboxed and judge.config.sandbox == "auto":
        err.print(f"[bold yellow]warning:[/] no sandbox here ({sandbox.probe()}): candidates run as plain processes "
                  "with your rights; --sandbox required refuses instead", highlight=False, soft_wrap=True)


def make_judge(backend: str, cache_dir: Optional[Path], trials: int = JudgeConfig.num_trials,
               seed: Optional[int] = None, **settings):
    from ..judge import Judge

    judge = Judge(backend, config(cache_dir, trials, seed, **settings))
    warn_unsandboxed(judge)
    return judge



def fail(message: str, as_json: bool = False) -> None:
    """Say what is wrong and exit 2; with --json the same message also goes to stdout as {"error": ...}."""
    if as_json:
        sys.stdout.write(json.dumps({"error": message, "exit_code": EXIT_USAGE}) + "\n")
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_USAGE)


def writable(path: Optional[Path], option: str, file: bool = False) -> None:
    """One line and exit 2 unless this user can write `path` (a folder; with `file`, a file), or create it where it
    is missing: before any work, so that no run ends in a traceback over its output."""
    if path is None:
        return
    if path.exists():
        if path.is_dir() == file:
            fail(f"{option} {path}: {'a folder' if file else 'a file'}, not {'a file' if file else 'a folder'}")
        if not os.access(path, os.W_OK | (0 if file else os.X_OK)):
            fail(f"{option} {path}: not writable")
        return
    parent = next(p for p in path.absolute().parents if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        fail(f"{option} {path}: cannot be created ({parent} is not a writable folder)")


def fresh_folder(path: Optional[Path], option: str, overwrite: bool, resumes: Optional[str] = None) -> None:
    """One line and exit 2 when `path` is a folder that holds files, unless they are this command's earlier run (it
    holds `resumes`, which the command continues from) or `--overwrite` says to write over them."""
    if overwrite or path is None or not path.is_dir() or not any(path.iterdir()):
        return
    if resumes is None or not (path / resumes).exists():
        fail(f"{option} {path} holds files of an earlier run or another command: choose a new folder, or pass "
             "--overwrite to write over them")


def fmt(x: Optional[float], spec: str = ".1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def integers(text: Optional[str], option: str) -> Optional[list[int]]:
    try:
        return None if text is None else [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, got '{text}'") from None


def make_pool(backend: str, config, gpus: Optional[str], workers: Optional[int]):
    """The JudgePool of a suite command (says loudly when it runs unsandboxed)."""
    from ..judge.pool import JudgePool

    if workers is not None and workers < 1:
        raise ValueError("--workers must be at least 1")
    if gpus is not None and backend == "cpu":
        raise ValueError("--gpus picks GPUs for the cuda backend; the cpu backend has one device")
    pool = JudgePool(backend, config, devices=integers(gpus, "--gpus"), workers=workers)
    warn_unsandboxed(pool)
    return pool


def print_report(rep: dict, title: str, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(rep, indent=2, default=str) + "\n")
        return
    table = Table(title=Text(title))  # (folder names are the user's: never markup)
    # the kernelbench policy: "no finding" passes with no strict finding (torch called from Python is not among them:
    # only a strict run says whether the candidate's own kernels do all the work); fast_1.5: KernelBench's, vs eager
    lenient = "strict" in rep["overall"]
    for col in ("level", "n", "pass", *(["no strict finding"] if lenient else []), "faster than eager",
                "faster than compile", "geomean vs eager", "geomean vs compile", "fast_1.5"):
        table.add_column(col, justify="right")
    for name, s in [*rep["levels"].items(), ("overall", rep["overall"])]:
        table.add_row(name, str(s["n"]), f"{s['pass_rate']:.1%}",
                      *([f"{s['strict']['pass_rate_without_findings']:.1%}"] if lenient else []),
                      f"{s['faster_than_eager']:.1%}", f"{s['faster_than_compile']:.1%}",
                      fmt(s["geomean_speedup_vs_eager"], ".2f", "x"), fmt(s["geomean_speedup_vs_compile"], ".2f", "x"),
                      f"{s['fast_p_vs_eager']['fast_1.5']:.1%}")
    out.print(table)
    out.print(f"[dim]{rep['note']}[/]")
    if rep.get("suite_revision"):
        out.print(f"suite: {describe(rep['suite_revision'])}", highlight=False, soft_wrap=True)
    kb = rep["overall"].get("kernelbench_timing")
    if kb:
        def pair(key: str) -> str:
            return f"{fmt(kb[key], '.2f', 'x')} (ours {fmt(kb[key + '_ours'], '.2f', 'x')})"
        out.print(f"{kb['method']} timing (in the candidate's process; {kb['timed']} tasks, {kb['failed']} failed): "
                  f"geomean vs eager {pair('geomean_speedup_vs_eager')}, vs compile "
                  f"{pair('geomean_speedup_vs_compile')}, fast_1.5 {kb['fast_p_vs_eager']['fast_1.5']:.1%}",
                  highlight=False, soft_wrap=True)
    for level, pub in (rep.get("published") or {}).items():
        if pub:
            differ = ", ".join(d["task"].split("/")[-1] for d in pub["disagree"][:8])
            hardware = ", ".join(map(str, pub["hardware"])) or "hardware unknown"
            out.print(f"{level}: KernelBench's published results ({hardware}) "
                      f"agree on {pub['agree']} of {pub['n']} (published pass {pub['pass_rate_published']:.1%}, here "
                      f"{pub['pass_rate_here']:.1%})" + (f"; differ: {differ}" if differ else ""),
                      highlight=False, soft_wrap=True, markup=False)
    if rep["overall"].get("reference_errors"):
        out.print(f"{rep['overall']['reference_errors']} task(s) whose reference failed here (counted as failures; "
                  "not stored: judged again next run; the task's or this machine's problem, not the solution's)",
                  highlight=False, soft_wrap=True)
    if lenient and rep["overall"]["strict"]["findings_by_kind"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in rep["overall"]["strict"]["findings_by_kind"].items())
        out.print(f"passing KernelBench's rules but not the strict judge's checks: {kinds}", highlight=False,
                  soft_wrap=True)
    below = sorted((t for t in rep["tasks"] if t["verdict"]["reward"] < 3), key=lambda t: t["verdict"]["reward"])
    if below:
        shown, failing = 10, sum(1 for t in below if not t["verdict"]["correct"])
        out.print(f"below reward 3: {len(below)} of {len(rep['tasks'])} tasks ({failing} not correct)",
                  highlight=False, soft_wrap=True)
        width = max(len(t["task"]) + (0 if t.get("sample") is None else 12) for t in below[:shown])
        for t in below[:shown]:  # whole names and reasons, never wrapped or padded (piped or not)
            v = Verdict.from_dict(t["verdict"])
            name = t["task"] if t.get("sample") is None else f"{t['task']} sample {t['sample']}"
            out.print(f"  {name:<{width}}  reward {v.reward:>2}  {v.reason[:200]}", highlight=False,
                      soft_wrap=True, markup=False)
        if len(below) > shown:
            out.print(f"... and {len(below) - shown} more (--json, or `cuda-agent report` on the database, for all)",
                      highlight=False, soft_wrap=True)


def notify(message: str) -> None:
    err.print(f"[yellow]{message}[/]", highlight=False, soft_wrap=True)
