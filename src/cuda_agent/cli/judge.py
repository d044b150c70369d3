"""`eval` and `eval-suite`: one candidate, or a folder of solutions against a suite."""

from __future__ import annotations

import fnmatch
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from ..backend import BackendError
from ..judge.config import JudgeConfig
from ..task import DATASET_SUFFIXES, TaskError, dataset_row
from ..workspace.candidate import CandidateError
from . import common
from .common import (app, err, fail, fmt, integers, make_judge, make_pool, notify, out, print_report,
                     writable)
from .options import (BACKEND_HELP, EXIT_REJECTED, FAIL_ON_REJECT, SUITE_HELP, AllowTf32, Atol, Backends, CacheDir,
                      CompileMode, MaxErrorRatio, Policy, Rtol, SandboxMode, Timeout, Timing, Trials)
from .progress import Progress

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
        rows.append(("time (us)", f"eager {fmt(t['eager'])}   compile {fmt(t['compile'])}   "
                                  f"candidate {fmt(t['candidate'])}"))
    if v.speedup_vs_eager or v.speedup_vs_compile:
        rows.append(("speedup", f"vs eager {fmt(v.speedup_vs_eager, '.2f', 'x')}   "
                                f"vs compile {fmt(v.speedup_vs_compile, '.2f', 'x')}"))
    kb = v.kernelbench_timing
    if kb:
        rows.append((kb["method"], kb["error"] if kb.get("error") else
                     f"eager {fmt(kb['eager_ms'], '.4g')}   compile {fmt(kb['compile_ms'], '.4g')}   candidate "
                     f"{fmt(kb['candidate_ms'], '.4g')} ms   speedup vs eager {fmt(kb['speedup_vs_eager'], '.2f', 'x')}"
                     f"   vs compile {fmt(kb['speedup_vs_compile'], '.2f', 'x')}   (in the candidate's process)"))
    if v.correct or v.max_abs_error:  # outputs were compared
        e = v.error_vs_fp64
        rows.append(("numerics", f"max abs error {fmt(v.max_abs_error, '.2e')}   rel {fmt(v.max_rel_error, '.2e')}"
                                 f"   vs fp64: candidate {fmt(e['candidate'], '.2e')}, fp32 eager "
                                 f"{fmt(e['eager_fp32'], '.2e')}"))
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
    reference: Path = typer.Argument(..., metavar="REFERENCE", help="KernelBench-format reference file (class Model, "
                                     "get_inputs, ...), or a dataset from `data build` (.parquet/.jsonl) with --row"),
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
    timing: Timing = JudgeConfig.timing,
    fail_on_reject: bool = FAIL_ON_REJECT,
) -> None:
    """Judge one candidate against a reference: build, verify, audit, time, reward."""
    writable(cache_dir, "--cache-dir")
    if row is not None and reference.suffix not in DATASET_SUFFIXES:
        fail(f"--row picks a row of a dataset ({', '.join(DATASET_SUFFIXES)}); {reference} is a single task", as_json)
    rows = Path(tempfile.mkdtemp(prefix="cuda-agent-row-")) if reference.suffix in DATASET_SUFFIXES else None
    try:
        if rows is not None:
            reference = dataset_row(reference, row, rows)
        judge = make_judge(backend, cache_dir, trials, seed, atol=atol, rtol=rtol, allow_tf32=allow_tf32,
                       keep_run_dirs=keep, compile_mode=compile_mode, run_timeout_s=timeout,
                       max_error_ratio=max_error_ratio, sandbox=sandbox_mode, policy=policy, timing=timing)
        what = f"judging {solution} against {reference.name} on {backend}"
        with judge, err.status(f"{what}...") as status:
            judge.on_phase = _phase_reporter(status, what)
            verdict = judge.evaluate(reference, solution)
    except (TaskError, CandidateError, BackendError, ValueError) as exc:
        fail(str(exc), as_json)
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
    suite_dir: Path = typer.Argument(..., metavar="SUITE_DIR", help=SUITE_HELP),
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
    timing: Timing = JudgeConfig.timing,
    db: Optional[Path] = typer.Option(None, help="results database (default: in the cache); reruns resume from it"),
    workers: Optional[int] = typer.Option(None, min=1, help="evaluations in flight at once (default: enough for every "
                                          "core and GPU; 1: one at a time)"),
    gpus: Optional[str] = typer.Option(None, help="GPU indices to judge on, e.g. 0,1 (default: the default GPU)"),
    fail_on_reject: bool = typer.Option(False, "--fail-on-reject", help="exit 1 when any task's solution is "
                                        "missing or not correct"),
    rejudge: list[str] = typer.Option([], "--rejudge", metavar="PATTERN", help="judge the tasks whose names match "
                                      "again instead of reusing their stored verdicts, e.g. 'level1/19_*' or '*' "
                                      "(repeatable)"),
) -> None:
    """Judge a folder of solutions against a suite; print per-level and overall rates and speedups."""
    writable(cache_dir, "--cache-dir")
    writable(db, "--db", file=True)
    from ..judge.store import Store
    from ..suite import runs
    from ..suite import kernelbench_runs
    from ..suite.evaluate import check_problem_ids, discover, evaluate_suite, report

    if not solutions.is_dir():
        fail(f"solutions {solutions}: no such folder", as_json)
    try:
        tasks = discover(suite_dir, integers(levels, "--levels"))
        if kernelbench_runs.is_generation_folder(solutions):
            check_problem_ids(tasks)
        unmatched = [p for p in rejudge if not any(fnmatch.fnmatchcase(t.name, p) for t in tasks)]
        if unmatched:
            raise ValueError(f"--rejudge {unmatched[0]}: matches no task (names look like {tasks[0].name})")
        config = common.config(cache_dir, trials, atol=atol, rtol=rtol, allow_tf32=allow_tf32,
                               compile_mode=compile_mode, run_timeout_s=timeout, max_error_ratio=max_error_ratio,
                               sandbox=sandbox_mode, policy=policy, timing=timing)
        pool = make_pool(backend, config, gpus, workers)
    except (FileNotFoundError, BackendError, ValueError) as exc:
        fail(str(exc), as_json)
    store = Store(db or pool.cache_dir / "suite.sqlite")
    run = runs.RunInfo.begin(pool, suite_dir, solutions)
    with Progress(err) as progress, pool:
        bar = progress.add("judging", total=len(tasks))

        def on_result(task, verdict, resumed):
            tag = "resumed" if resumed else f"reward {verdict.reward}"
            progress.advance(bar, f"{task.name}: {tag}", resumed=resumed)

        records = evaluate_suite(pool, tasks, solutions, store, on_result, notify, rejudge)
    rep = runs.finish(report(records), run)
    run_id = runs.save(store, rep)  # for `cuda-agent report DB [--run ID]`
    print_report(rep, f"run {run_id}: {suite_dir} vs {solutions} ({backend})", as_json)
    if fail_on_reject and rep["overall"]["pass_rate"] < 1:
        raise typer.Exit(EXIT_REJECTED)
