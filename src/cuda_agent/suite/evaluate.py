"""Evaluate a folder of solutions against a KernelBench-layout suite, resumably, and summarise it.

Layout: SUITE/level1/19_ReLU.py ... ; a solution is SOLUTIONS/level1/19_ReLU.py (single file) or
SOLUTIONS/level1/19_ReLU/ (workspace), or SOLUTIONS is a KernelBench generation folder
(`level_1_problem_19_sample_0_kernel.py`, several samples per problem: kernelbench_runs.py). Each verdict is stored
in SQLite under a key made of the task's and the solution's content hashes and everything else that can change a
verdict (`measurement_key`: the judge's settings and version, the build toolchain and torch, the devices, their
driver and CUDA), so an interrupted run resumes where it stopped, and a changed solution, setting, machine or
upgrade is judged again.
"""

from __future__ import annotations

import fnmatch
import os
import re
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..judge import Verdict
from ..judge.pool import JudgePool
from ..judge.store import Store
from ..judge.wire.gpu_order import CALL_STREAM_ENV
from ..task import TaskError, load_task
from ..workspace.candidate import CandidateError, load_candidate
from . import kernelbench_runs, revisions

SUMMARY_NOTE = ("geometric means are over correct tasks only; 'faster' means speedup > 1.0; fast_p: the share of "
                "all problems correct and faster than the baseline by more than p (KernelBench's metric)")


@dataclass
class SuiteTask:
    level: str
    path: Path

    @property
    def name(self) -> str:
        return f"{self.level}/{self.path.name}"


def levels_present(suite_dir: Path) -> list[int]:
    found = [int(m.group(1)) for p in Path(suite_dir).iterdir() if p.is_dir() and (m := re.fullmatch(r"level(\d+)",
                                                                                                      p.name))]
    if not found:
        raise FileNotFoundError(f"suite {suite_dir}: no levelN folders")
    return sorted(found)


def discover(suite_dir: Path, levels: Iterable[int] | None = None) -> list[SuiteTask]:
    """The suite's tasks, level by level (all `levelN` folders present when `levels` is None)."""
    if not Path(suite_dir).is_dir():
        raise FileNotFoundError(f"suite {suite_dir}: no such folder")
    tasks = []
    chosen = levels_present(suite_dir) if levels is None else list(levels)
    for level in chosen:
        folder = Path(suite_dir) / f"level{level}"
        if not folder.is_dir():
            raise FileNotFoundError(f"suite {suite_dir}: no folder level{level}")
        files = [p for p in folder.glob("*.py") if not p.name.startswith("_")]
        files.sort(key=lambda p: (int(m.group(1)) if (m := re.match(r"(\d+)_", p.name)) else 10**9, p.name))
        tasks += [SuiteTask(f"level{level}", p) for p in files]
    if not tasks:
        raise FileNotFoundError(f"suite {suite_dir}: no tasks (.py files) in level(s) "
                                f"{', '.join(map(str, chosen))}")
    return tasks


def solution_places(solutions_dir: Path, task: SuiteTask) -> tuple[Path, Path]:
    """Where a task's solution may be: a single file of the same name, or a workspace folder named for its stem."""
    return Path(solutions_dir) / task.level / task.path.name, Path(solutions_dir) / task.level / task.path.stem


def find_solution(solutions_dir: Path, task: SuiteTask) -> Path | None:
    single, workspace = solution_places(solutions_dir, task)
    if single.is_file():
        return single
    if workspace.is_dir():
        return workspace
    return None


REFERENCE_ERROR = "reference error"  # a verdict's error when the task's reference failed, not the solution


def missing_verdict(backend: str, reason: str) -> Verdict:
    return Verdict(reward=-1, compiled=False, correct=False, error=reason, backend=backend)


def measurement_key(pool: JudgePool) -> str:
    """Everything besides the task and the solution that changes a verdict: the judge's settings and version
    (`verdict_key`), the build toolchain, torch and Python (`identity`), the devices, driver and CUDA (`machine`),
    and the clock (on the GPU the in-process one, which believes the candidate, and the calls' stream)."""
    return "|".join([pool.config.verdict_key(), pool.backend.identity(), pool.backend.machine(),
                     pool.backend.timing_method, os.environ.get(CALL_STREAM_ENV, "")])


def solutions_of(solutions_dir: Path, task: SuiteTask) -> list[tuple[int | None, Path | None]]:
    """The task's solutions as (sample id, path): one in this repository's layout (sample None; path None when
    missing), each sample in a KernelBench generation folder, sample 0 always (missing: a failure, as KernelBench
    counts it, never replaced by the next sample present)."""
    if kernelbench_runs.is_generation_folder(solutions_dir):
        found = kernelbench_runs.samples(solutions_dir, task.level, task.path)
        return found if found and found[0][0] == 0 else [(0, None), *found]
    return [(None, find_solution(solutions_dir, task))]


def check_problem_ids(tasks: list[SuiteTask]) -> None:
    """A generation folder names problems by level and number: two tasks of one number in a level would both be
    credited with its samples (ValueError)."""
    seen: dict[tuple[str, int | None], SuiteTask] = {}
    for task in tasks:
        key = (task.level, kernelbench_runs.problem_id(task.path))
        if key in seen:
            raise ValueError(f"{seen[key].name} and {task.name} are both problem {key[1]} of {task.level}: a "
                             "generation folder's samples cannot tell them apart (judge one of them)")
        seen[key] = task


def evaluate_suite(pool: JudgePool, tasks: list[SuiteTask], solutions_dir: Path, store: Store,
                   on_result: Callable[[SuiteTask, Verdict, bool], None] | None = None,
                   notify: Callable[[str], None] = lambda message: None,
                   rejudge: Iterable[str] = ()) -> list[dict]:
    """Judge every task's solutions (reusing stored verdicts, except for the tasks whose names match a `rejudge`
    pattern, e.g. "level1/19_*"), as many at once as the pool takes; one record per solution (per sample in a
    generation folder), in the suite's order. Each verdict is stored the moment it is known (not a failure of the
    reference or of the judge, which is judged again next run). Interrupted (Ctrl-C),
    nothing new starts and the evaluations in flight finish and are stored; interrupted again, they are
    abandoned."""
    backend = pool.backend.name
    settings = measurement_key(pool)
    rejudge = list(rejudge)
    verdicts: dict[int, Verdict] = {}
    hashes: dict[int, str] = {}  # each task's content hash (which revision of a suite was judged)
    pending: dict[Future, tuple[int, str]] = {}
    if kernelbench_runs.is_generation_folder(solutions_dir):
        check_problem_ids(tasks)
    jobs = [(task, sample, solution) for task in tasks for sample, solution in solutions_of(solutions_dir, task)]

    def record(future: Future) -> None:
        i, key = pending[future]
        try:
            verdicts[i] = future.result()
            store.put("suite", key, verdicts[i].to_dict())
        except TaskError as exc:  # the task's failure or this machine's (a CUDA error while the GPU is full): not
            # the solution's, so not stored (judged again next run; `reference_errors` in the summary)
            verdicts[i] = missing_verdict(backend, f"{REFERENCE_ERROR}: {exc}")
        except Exception as exc:  # the judge's own failure on this job: reported, not stored (judged again next run)
            verdicts[i] = missing_verdict(backend, f"the judge failed on this solution: {type(exc).__name__}: {exc}")
        del pending[future]
        if on_result:
            on_result(jobs[i][0], verdicts[i], False)

    try:
        for i, (task, sample, solution) in enumerate(jobs):
            try:
                ref = load_task(task.path)
                cand = load_candidate(solution) if solution else None
                cand_hash = cand.hash if cand else "none"
            except (TaskError, CandidateError) as exc:
                ref, cand, early = None, None, str(exc)
            except (OSError, ValueError) as exc:  # (a file name that is not UTF-8, say)
                ref, cand, early = None, None, f"{solution}: {type(exc).__name__}: {exc}"
            else:
                single, workspace = solution_places(solutions_dir, task)
                early = None if cand else f"no solution found for {task.name} " + (
                    f"(no level_{task.level.removeprefix('level')}_problem_"
                    f"{kernelbench_runs.problem_id(task.path)}_sample_S_kernel.py in {solutions_dir})"
                    if sample is not None else f"(neither {single} nor a folder {workspace})")
            key = f"{settings}|{ref.hash if ref else task.name}|{cand_hash if cand else 'none'}"
            if ref:
                hashes[i] = ref.hash
            again = any(fnmatch.fnmatchcase(task.name, pattern) for pattern in rejudge)
            stored = None if again else store.get("suite", key)
            if stored is not None or early:
                verdicts[i] = Verdict.from_dict(stored) if stored is not None else missing_verdict(backend, early)
                if on_result:
                    on_result(task, verdicts[i], stored is not None)
            else:
                pending[pool.submit(ref, cand)] = (i, key)
        for future in as_completed(list(pending)):
            record(future)
    except KeyboardInterrupt:  # (also while tasks are still being submitted: those submitted finish)
        running = [f for f in list(pending) if not f.cancel()]
        notify(f"interrupted: finishing the {len(running)} evaluation(s) in flight (Ctrl-C again to abandon them)")
        for future in as_completed(running):
            if future in pending:
                record(future)
        raise
    judged = {int(task.level.removeprefix("level")) for task, sample, found in jobs if sample is not None and found}
    return [{"level": task.level, "task": task.name, "task_hash": hashes.get(i),
             "kernelbench_file": revisions.lookup(task.path), "sample": sample,
             "solution": str(solution) if solution else None, "verdict": verdicts[i].to_dict(),
             **({"published": found} if (found := kernelbench_runs.published(solutions_dir, task.level, task.path,
                                                                            sample, judged)) else {})}
            for i, (task, sample, solution) in enumerate(jobs)]


def summarize(verdicts: list[dict]) -> dict:
    """One verdict per problem: pass rate, faster-than rates, geometric mean speedups, mean reward, KernelBench's
    `fast_p` against eager and against torch.compile, under the kernelbench policy what strict would add, and with
    `--timing kernelbench` the speedups by KernelBench's own timing beside these."""
    n = len(verdicts)
    correct = [v for v in verdicts if v["correct"]]
    eager = [v["speedup_vs_eager"] for v in correct if v.get("speedup_vs_eager")]
    compiled = [v["speedup_vs_compile"] for v in correct if v.get("speedup_vs_compile")]

    def rate(count: int) -> float:
        return count / n if n else 0.0

    summary = {
        "n": n,
        "pass_rate": rate(len(correct)),
        "faster_than_eager": rate(sum(1 for x in eager if x > 1.0)),
        "faster_than_compile": rate(sum(1 for x in compiled if x > 1.0)),
        "geomean_speedup_vs_eager": kernelbench_runs.geomean(eager),
        "geomean_speedup_vs_compile": kernelbench_runs.geomean(compiled),
        "mean_reward": sum(v["reward"] for v in verdicts) / n if n else None,
        "reference_errors": sum(1 for v in verdicts if (v.get("error") or "").startswith(REFERENCE_ERROR)),
        "fast_p_vs_eager": kernelbench_runs.fast_p(verdicts, n, "speedup_vs_eager"),
        "fast_p_vs_compile": kernelbench_runs.fast_p(verdicts, n, "speedup_vs_compile"),
    }
    if any(v.get("policy") == "kernelbench" for v in verdicts):
        summary["strict"] = kernelbench_runs.strict_view(verdicts)
    timed = kernelbench_runs.timing_view(verdicts)
    if timed:
        summary["kernelbench_timing"] = timed
    return summary


def best_per_problem(records: list[dict]) -> dict[str, dict]:
    """Each problem's best record: the highest reward, then the fastest against torch.compile."""
    best: dict[str, dict] = {}
    for r in records:
        v, held = r["verdict"], best.get(r["task"])
        if held is None or (v["reward"], v.get("speedup_vs_compile") or 0.0) > \
                (held["verdict"]["reward"], held["verdict"].get("speedup_vs_compile") or 0.0):
            best[r["task"]] = r
    return best


def report(records: list[dict]) -> dict:
    """Per level and overall, over each problem's first sample (KernelBench's `fast_p` is over sample 0; in this
    repository's layout, the one solution); with several samples, also over each problem's best (`best_of_samples`)
    and which sample that was (`best_samples`)."""
    levels = sorted({r["level"] for r in records}, key=lambda s: int(s.removeprefix("level")))
    first = {}
    for r in records:
        first.setdefault(r["task"], r)
    first_records = list(first.values())
    out = {
        "levels": {lvl: summarize([r["verdict"] for r in first_records if r["level"] == lvl]) for lvl in levels},
        "overall": summarize([r["verdict"] for r in first_records]),
        "note": SUMMARY_NOTE,
        "suite_revision": revisions.summarise([r.get("kernelbench_file") for r in first_records]),
        "tasks": records,
    }
    if any(r.get("published") for r in records):  # KernelBench's own results of the run, beside the verdicts here
        out["published"] = {lvl: kernelbench_runs.published_view([r for r in records if r["level"] == lvl])
                            for lvl in levels}
    if len(first_records) < len(records):  # several samples per problem
        best = best_per_problem(records)
        out["best_of_samples"] = {lvl: summarize([r["verdict"] for r in best.values() if r["level"] == lvl])
                                  for lvl in levels}
        out["best_samples"] = {task: r["sample"] for task, r in best.items()}
    return out
