"""`optimize` and `optimize-suite`: the agent on one task, or on every task of a suite."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from ..agent.config import LoopConfig
from ..backend import BackendError
from ..task import DATASET_SUFFIXES, TaskError, dataset_row
from . import common
from .common import (app, err, fail, fmt, fresh_folder, integers, make_judge, make_pool, notify, out, print_report,
                     writable)
from .options import (AGENT_SANDBOX, BACKEND_HELP, EPISODE_TIME, MAX_TOKENS, OVERWRITE, SUITE_HELP, TEMPERATURE,
                      TOOL_FORMAT, TOP_P, Backends)
from .progress import Progress

@app.command("optimize")
def optimize_cmd(
    reference: Optional[Path] = typer.Argument(None, metavar="[REFERENCE]", help="KernelBench-format reference file "
                                               "to optimise, or a dataset from `data build` (.parquet/.jsonl) with "
                                               "--row (or --module / --hf-model instead)"),
    row: Optional[int] = typer.Option(None, min=0, help="the dataset row to optimise"),
    module: Optional[str] = typer.Option(None, "--module", metavar="FILE.py:CLASS", help="your module instead of a "
                                         "task (with --init and --inputs, as `task new`): the best kernel is then "
                                         "exported into RUN/export"),
    init: str = typer.Option("[]", help="with --module: its constructor's arguments, a Python list"),
    inputs: Optional[str] = typer.Option(None, help="with --module: one sample of forward's arguments, a Python list"),
    hf_model: Optional[Path] = typer.Option(None, "--hf-model", help="a transformers model folder instead of a task "
                                            "(with --submodule and --sample): the best kernel is exported and checked "
                                            "in the whole model"),
    submodule: Optional[str] = typer.Option(None, help="with --hf-model: the submodule, e.g. model.layers.0.mlp"),
    sample: Optional[str] = typer.Option(None, help="with --hf-model: text the model runs on"),
    model: str = typer.Option(..., "--model", help="model name served by the endpoint"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint, e.g. "
                                           "http://localhost:8000/v1 (vLLM, SGLang); key from $OPENAI_API_KEY"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    max_turns: int = typer.Option(LoopConfig.max_turns, min=1, help="turns before the episode stops"),
    max_context: int = typer.Option(LoopConfig.max_context, min=1, help="context tokens (as the endpoint reports "
                                    "them) before it stops"),
    episode_time: Optional[float] = EPISODE_TIME,
    out_dir: Optional[Path] = typer.Option(None, "--out", help="run folder (default runs/<task>-<time>)"),
    single_turn: bool = typer.Option(False, help="one generation, files parsed from the reply, judged once"),
    temperature: float = TEMPERATURE,
    top_p: Optional[float] = TOP_P,
    max_tokens: int = MAX_TOKENS,
    tool_format: Literal["native", "text"] = TOOL_FORMAT,
    sandbox_mode: Literal["required", "auto", "none"] = AGENT_SANDBOX,
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache"),
    overwrite: bool = OVERWRITE,
) -> None:
    """Run the agent on one task and keep the best verified kernel (workspace, trajectory, summary in --out)."""
    writable(out_dir, "--out")
    fresh_folder(out_dir, "--out", overwrite)
    writable(cache_dir, "--cache-dir")
    if row is not None and reference.suffix not in DATASET_SUFFIXES:
        fail(f"--row picks a row of a dataset ({', '.join(DATASET_SUFFIXES)}); {reference} is a single task")
    import time as _time

    from ..agent import Environment, LLMError, LoopState, OpenAIClient, run_episode
    from ..task import load_task

    stamp = _time.strftime('%Y%m%d-%H%M%S')
    if sum(x is not None for x in (reference, module, hf_model)) != 1:
        fail("give one of REFERENCE, --module FILE.py:CLASS (with --inputs) or --hf-model DIR (with --submodule and "
             "--sample)")
    if hf_model is not None and (not submodule or sample is None):
        fail("--hf-model needs --submodule and --sample")
    if module is not None and (inputs is None or not module.rpartition(":")[0].endswith(".py")):
        fail("--module FILE.py:CLASS needs --inputs (one sample of forward's arguments)")
    from_module = None
    if reference is None:
        from ..export import module_run
        from ..user_task import UserTaskError

        out_dir = out_dir or Path("runs") / f"{(module or submodule).rpartition(':')[2]}-{stamp}"
        try:
            reference, made, name = module_run.make_task(out_dir, module, init, inputs, hf_model, submodule, sample)
        except UserTaskError as exc:
            fail(str(exc))
        from_module = (made, name)
        out.print(f"task from {module or f'{hf_model}:{submodule}'}: {reference}", highlight=False, soft_wrap=True)
    try:
        if reference.suffix in DATASET_SUFFIXES:  # the row's code becomes the run's reference file
            out_dir = out_dir or Path("runs") / f"{reference.stem}_row{row}-{stamp}"
            reference = dataset_row(reference, row, out_dir)
        task = load_task(reference)
        judge = make_judge(backend, cache_dir, sandbox=sandbox_mode)
        client = OpenAIClient(model, base_url, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                              tool_format=tool_format)
        client.check()  # fail fast on a missing or unreachable endpoint
    except (TaskError, BackendError, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:  # transformers: a folder without weights or tokenizer files
        fail(f"model {model}: {exc}")
    except LLMError as exc:
        fail(f"endpoint {base_url or 'api.openai.com'} unusable: {exc}")
    run_dir = out_dir or Path("runs") / f"{task.name}-{stamp}"
    env = Environment(judge, run_dir, use_sandbox=judge.sandboxed)

    def show(state: LoopState) -> None:
        """A line per reply (what the model wrote and how long it took, tool calls or not) and per tool call."""
        if state.last_tool is None:
            calls = f"{state.reply_calls} tool call(s)" if state.reply_calls else "no tool call"
            err.print(f"turn {state.turn:>3}  model      {state.reply_tokens or '?'} tokens in {state.reply_s:.1f} s, "
                      f"{calls}  context {state.context_tokens}", highlight=False, soft_wrap=True)
            return
        best = "-" if state.best_reward is None else \
            f"{state.best_reward} ({fmt(state.best_speedup, '.2f', 'x')} vs compile)"
        err.print(f"turn {state.turn:>3}  {state.last_tool:<10} best reward {best}  "
                  f"context {state.context_tokens}", highlight=False, soft_wrap=True)

    with judge:
        summary = run_episode(env, client, reference, run_dir,
                              LoopConfig(max_turns=max_turns, max_context=max_context, single_turn=single_turn,
                                         time_limit_s=episode_time), show)
    final = summary.final_verdict or {}
    stop = summary.stop + (f" ({summary.stop_detail})" if summary.stop_detail else "")
    out.print(f"stopped: {stop} after {summary.turns} turn(s); {summary.snapshots} verified "
              f"candidate(s)", highlight=False, soft_wrap=True)
    if final:
        out.print(f"[bold]best: reward {final['reward']}[/], {fmt(final.get('speedup_vs_compile'), '.2f', 'x')} vs "
                  f"torch.compile -> {summary.best_dir}", highlight=False, soft_wrap=True)
    else:
        out.print("[bold red]no verified candidate[/]")
    out.print(f"run folder: {run_dir} (trajectory.jsonl, summary.json)", highlight=False, soft_wrap=True)
    if from_module is not None:
        _export_best(run_dir, reference, summary.best_dir if final else None, from_module, backend, hf_model,
                     submodule, sample, cache_dir)


def _export_best(run_dir: Path, task: Path, best_dir: Optional[str], from_module: tuple, backend: str,
                 hf_model: Optional[Path], submodule: Optional[str], sample: Optional[str],
                 cache_dir: Optional[Path]) -> None:
    """`optimize --module/--hf-model`: the best kernel exported (and checked in the whole model); module.json."""
    from ..export import ExportError, module_run
    from ..export.check_model import CheckError

    made, name = from_module
    try:
        record = module_run.finish(run_dir, task, best_dir, name, backend, hf_model, submodule, sample, made.notes,
                                   cache_dir)
    except (ExportError, CheckError) as exc:
        fail(f"the best kernel could not be exported: {exc}")
    if record["export"] is None:
        out.print("nothing to export (no verified kernel)", highlight=False, soft_wrap=True)
        return
    out.print(f"exported: {record['export']['package']} ({name}.{record['export']['class']}) and "
              f"{record['export']['kernels_build']}", highlight=False, soft_wrap=True)
    check = record["check"]
    if check:
        out.print(f"whole model: outputs {'match' if check['within_tolerance'] else 'DIFFER'} (max abs difference "
                  f"{check['max_abs_diff']:.2e}), {check['time_us']['original']:.1f} -> "
                  f"{check['time_us']['replaced']:.1f} us ({check['speedup']:.2f}x)", highlight=False,
                  soft_wrap=True)
    out.print(f"record: {run_dir / 'module.json'}", highlight=False, soft_wrap=True)


@app.command("optimize-suite")
def optimize_suite_cmd(
    suite_dir: Path = typer.Argument(..., metavar="SUITE_DIR", help=SUITE_HELP),
    model: str = typer.Option(..., "--model", help="model name served by the endpoint"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint (vLLM, SGLang, ...)"),
    out_dir: Path = typer.Option(..., "--out", help="suite run folder (runs/, solutions/, report.json); rerun the "
                                 "same command to resume"),
    levels: Optional[str] = typer.Option(None, help="comma-separated levels (default: every levelN folder there)"),
    limit: Optional[int] = typer.Option(None, min=1, help="only the first N tasks (in suite order)"),
    concurrency: int = typer.Option(4, min=1, help="episodes at once"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    max_turns: int = typer.Option(LoopConfig.max_turns, min=1, help="turns per episode"),
    max_context: int = typer.Option(LoopConfig.max_context, min=1, help="context tokens per episode"),
    episode_time: Optional[float] = EPISODE_TIME,
    temperature: float = TEMPERATURE,
    top_p: Optional[float] = TOP_P,
    max_tokens: int = MAX_TOKENS,
    tool_format: Literal["native", "text"] = TOOL_FORMAT,
    sandbox_mode: Literal["required", "auto", "none"] = AGENT_SANDBOX,
    workers: Optional[int] = typer.Option(None, min=1, help="judge evaluations in flight at once (default: the "
                                          "pool's)"),
    gpus: Optional[str] = typer.Option(None, help="GPU indices to judge on, e.g. 0,1 (default: the default GPU)"),
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Run the agent on every task of a suite (N episodes at once, one judge pool), export each task's best kernel
    in KernelBench layout and report on them as eval-suite does."""
    writable(out_dir, "--out")
    writable(cache_dir, "--cache-dir")
    from ..agent import LLMError, OpenAIClient
    from ..suite.evaluate import discover
    from ..suite.optimize import optimize_suite

    try:
        if concurrency < 1 or (limit is not None and limit < 1):
            raise ValueError("--concurrency and --limit must be at least 1")
        tasks = discover(suite_dir, integers(levels, "--levels"))[:limit]
        pool = make_pool(backend, common.config(cache_dir, sandbox=sandbox_mode), gpus, workers)

        def make_client():
            return OpenAIClient(model, base_url, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                tool_format=tool_format)

        make_client().check()
    except (FileNotFoundError, BackendError, ValueError) as exc:
        fail(str(exc))
    except LLMError as exc:
        fail(f"endpoint {base_url or 'api.openai.com'} unusable: {exc}")
    with Progress(err) as progress, pool:
        episodes = progress.add("episodes", total=len(tasks))
        judged = progress.add("judging the best", total=len(tasks))

        def on_episode(task, summary, resumed):
            best = (summary.final_verdict or {}).get("reward")
            tag = "resumed" if resumed else f"{summary.turns} turns, best reward {best}"
            progress.advance(episodes, f"{task.name}: {tag}", resumed=resumed)

        def on_result(task, verdict, resumed):
            progress.advance(judged, f"{task.name}: {'resumed' if resumed else f'reward {verdict.reward}'}",
                             resumed=resumed)

        loop = LoopConfig(max_turns=max_turns, max_context=max_context, time_limit_s=episode_time)
        rep = optimize_suite(pool, tasks, out_dir, make_client, loop, concurrency, on_episode, on_result, notify)
    print_report(rep, f"{model} on {suite_dir} ({backend})", as_json)
    if not as_json:
        out.print(f"best kernels: {out_dir / 'solutions'} (eval-suite {suite_dir} --solutions ... re-judges them); "
                  f"report: {out_dir / 'report.json'}", highlight=False, soft_wrap=True)
