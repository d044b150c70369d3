"""The agent over a whole suite (the paper's evaluation protocol): one episode per task, `concurrency` at a time,
all judged by one shared pool; then each task's best kernel exported in KernelBench layout and judged again as
`eval-suite` judges a folder of solutions.

    OUT/runs/levelN/<task>/       each episode's run folder (trajectory.jsonl, summary.json, best/)
    OUT/solutions/levelN/<task>/  the task's best verified kernel (a workspace), for `eval-suite --solutions`
    OUT/report.json               the suite report over OUT/solutions, with each episode's turns and stop reason

Resumable: a task whose episode finished (its summary.json exists) is not run again; an interrupted episode starts
over (Ctrl-C starts no more episodes and stops the judge, so those running end at their next evaluation); the final
judging resumes from OUT/suite.sqlite.
"""

from __future__ import annotations

import json
import shutil
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

from ..agent import EpisodeSummary, Environment, LoopConfig, Stop, run_episode
from ..judge.pool import JudgePool
from ..judge.store import Store
from ..workspace.candidate import load_candidate
from .evaluate import SuiteTask, evaluate_suite, report
from .runs import RunInfo, finish


def run_dir_of(out_dir: Path, task: SuiteTask) -> Path:
    return Path(out_dir) / "runs" / task.level / task.path.stem


def _episode(pool: JudgePool, task: SuiteTask, out_dir: Path, make_client: Callable[[], Any],
             loop: LoopConfig) -> tuple[EpisodeSummary, bool]:
    """The task's episode summary, and whether it was found from an earlier run."""
    run_dir = run_dir_of(out_dir, task)
    done = run_dir / "summary.json"
    if done.exists():
        summary = EpisodeSummary.from_dict(json.loads(done.read_text()))
        if summary.stop != Stop.INTERRUPTED:
            return summary, True
    if run_dir.exists():  # an episode that was interrupted: start it over
        shutil.rmtree(run_dir)
    try:
        env = Environment(pool, run_dir, use_sandbox=pool.sandboxed, episodes_root=Path(out_dir) / "runs")
        return run_episode(env, make_client(), task.path, run_dir, loop), False
    except Exception as exc:  # one task's failure (its reference, the endpoint) must not end the suite
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc())
        return EpisodeSummary(reference=str(task.path), stop=Stop.EPISODE_FAILED.value,
                              stop_detail=f"{type(exc).__name__}: {exc}"), False


def export_best(out_dir: Path, tasks: list[SuiteTask], summaries: dict[str, EpisodeSummary]) -> Path:
    """Each task's best kernel into OUT/solutions (rewritten from the summaries every time)."""
    solutions = Path(out_dir) / "solutions"
    shutil.rmtree(solutions, ignore_errors=True)
    for task in tasks:
        best = summaries[task.name].best_dir
        if best and Path(best).is_dir():
            load_candidate(Path(best)).write_to(solutions / task.level / task.path.stem)
    solutions.mkdir(parents=True, exist_ok=True)
    return solutions


def optimize_suite(pool: JudgePool, tasks: list[SuiteTask], out_dir: Path, make_client: Callable[[], Any],
                   loop: LoopConfig, concurrency: int = 1,
                   on_episode: Callable[[SuiteTask, EpisodeSummary, bool], None] | None = None,
                   on_result: Callable | None = None, notify: Callable[[str], None] = lambda message: None) -> dict:
    """Run every task's episode (`make_client()` gives each its own model client), export the best kernels, judge
    them; returns the report (also written to OUT/report.json)."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, EpisodeSummary] = {}
    run = RunInfo.begin(pool, tasks[0].path.parent.parent, out_dir / "solutions")
    with ThreadPoolExecutor(concurrency, thread_name_prefix="episode") as episodes:
        futures = {episodes.submit(_episode, pool, task, out_dir, make_client, loop): task for task in tasks}
        try:
            for future in as_completed(futures):
                task = futures[future]
                summaries[task.name], resumed = future.result()
                if on_episode:
                    on_episode(task, summaries[task.name], resumed)
        except KeyboardInterrupt:  # no episode starts; those running end at their next evaluation (rerun: resume)
            episodes.shutdown(wait=False, cancel_futures=True)
            pool.close(abandon=True)
            raise
    solutions = export_best(out_dir, tasks, summaries)
    records = evaluate_suite(pool, tasks, solutions, Store(out_dir / "suite.sqlite"), on_result, notify)
    for task, record in zip(tasks, records):
        s = summaries[task.name]
        record["episode"] = {"run_dir": str(run_dir_of(out_dir, task)), "stop": s.stop, "stop_detail": s.stop_detail,
                             "turns": s.turns, "snapshots": s.snapshots, "failed": s.stop == Stop.EPISODE_FAILED}
    rep = finish(report(records), run)
    (out_dir / "report.json").write_text(json.dumps(rep, indent=2, default=str))
    return rep
