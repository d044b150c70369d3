"""The expert's ceiling (issue 31): for every task it fuses, its kernel with the fast knobs and with random ones,
each judged `--repeats` times (the random ones `--random-repeats` times; fresh inputs, fresh timing), reported per
task set, family and knob setting: the share of reward >= 2 (faster than eager) and of reward 3 (faster than
torch.compile), the geometric-mean speedups, the eager and compile baselines, and how often a task's repeated
verdicts agree. "best" is each task's best knob
setting of those tried. One JSON line per verdict in `--out`.jsonl (a rerun with the same `--out` and arguments
judges only what it lacks, so a long run can be done a slice at a time); the table in `--out`.md, over them all.

    python3 benchmarks/expert_ceiling.py --data splits/train.jsonl --data splits/held_out.jsonl \\
        [--backend cuda] [--repeats 3] [--random 1] [--random-repeats N] [--limit N] [--time-limit S]
        [--out FILE] [--report-only]

The sets' tasks are judged in turn (one of each set, then the next), so `--time-limit` (then the evaluations not
started are dropped, those finished reported) leaves every set sampled alike.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from _common import machine, write

from cuda_agent.judge.pool import JudgePool
from cuda_agent.rl.expert.formulas import Unsupported
from cuda_agent.rl.expert.kernels import FAST, random_knobs, workspace_files
from cuda_agent.rl.expert.trace import trace
from cuda_agent.task import task_files


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def typical(verdicts: list[dict]) -> dict:
    """The median of a setting's repeated verdicts, by reward then speedup over compile (one crash of three does
    not stand for the setting)."""
    ranked = sorted(verdicts, key=lambda v: (v["reward"], v.get("speedup_vs_compile") or 0.0))
    return ranked[(len(ranked) - 1) // 2]


def summarise(label: str, family: str, knobs: str, verdicts: dict[str, list[dict]]) -> dict:
    """One table row over tasks: each task's verdicts (its repeats) for one knob setting, by their median; "stable"
    over the tasks judged more than once; "s/verdict" the median wall seconds of one evaluation in the pool."""
    firsts = [typical(v) for v in verdicts.values()]
    repeated = [v for v in verdicts.values() if len(v) > 1]  # stability: tasks with more than one verdict
    seconds = [x["seconds"] for v in verdicts.values() for x in v if x.get("seconds")]
    return {"set": label, "family": family, "knobs": knobs, "tasks": len(verdicts),
            "reward>=2": sum(v["reward"] >= 2 for v in firsts) / len(firsts),
            "reward 3": sum(v["reward"] >= 3 for v in firsts) / len(firsts),
            "correct": sum(v["reward"] >= 1 for v in firsts) / len(firsts),
            "vs eager": geomean([v.get("speedup_vs_eager") for v in firsts]),
            "vs compile": geomean([v.get("speedup_vs_compile") for v in firsts]),
            "eager us": geomean([v["times_us"].get("eager") for v in firsts]),
            "compile us": geomean([v["times_us"].get("compile") for v in firsts]),
            "judged again": len(repeated),
            "stable": sum(len({x["reward"] for x in v}) == 1 for v in repeated) / len(repeated) if repeated else None,
            "s/verdict": statistics.median(seconds) if seconds else None}


def interleaved(jobs: list[tuple], block: int) -> list[tuple]:
    """`jobs` (each task's evaluations together) reordered in blocks of `block` tasks: each task's first evaluation,
    then each one's second... An evaluation holds its task's warm reference worker, so a task's second evaluation
    right behind its first waits for it in a pool worker (`reference_queued`); a block still ends every task it
    starts before the next, so a slice cut by --time-limit judges whole tasks."""
    by_task: dict[tuple, list[tuple]] = defaultdict(list)
    for job in jobs:
        by_task[job[0], job[2]].append(job)
    tasks, out = list(by_task.values()), []
    for start in range(0, len(tasks), block):
        out += [job for turn in itertools.zip_longest(*tasks[start:start + block]) for job in turn if job]
    return out


def judge(todo: list[tuple], args, lines: list[dict], total: int, deadline: float, shapes: dict) -> None:
    """Judge `todo` (set, family, task, knobs name, knobs, folder) in a pool, each verdict appended to `lines` and
    to --out's .jsonl as it comes, until `deadline` (time.monotonic). `shapes`: each task's ops and row length."""
    log = args.out.with_suffix(".jsonl").open("a") if args.out else None
    pool = JudgePool(args.backend, workers=args.workers)
    try:
        futures = [pool.submit(task, folder) for _, _, task, _, _, folder in todo]
        for (label, family, task, name, knobs, _), future in zip(todo, futures):
            try:
                verdict = future.result(timeout=max(0.0, min(deadline - time.monotonic(), 1e6))).to_dict()
            except TimeoutError:
                print(f"time limit: {total - len(lines)} of {total} evaluations not judged (rerun with the "
                      "same --out to go on)", flush=True)
                break
            kept = ("reward", "speedup_vs_eager", "speedup_vs_compile", "times_us", "error", "warnings", "seconds",
                    "phases_s")
            lines.append({"set": label, "family": family, "task": task.stem, **shapes[task], "knobs": name,
                          "knob_values": asdict(knobs), **{k: verdict.get(k) for k in kept}})
            print(json.dumps(lines[-1]), flush=True)
            if log:
                log.write(json.dumps(lines[-1]) + "\n")
                log.flush()
    finally:
        pool.close(abandon=len(lines) < total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, action="append", required=True, help="task set (repeatable)")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--random-repeats", type=int, default=None, help="verdicts per random setting "
                        "(default: --repeats; 1 saves a third of a ceiling's time at --repeats 3 --random 1)")
    parser.add_argument("--random", type=int, default=1, help="random knob settings per task")
    parser.add_argument("--limit", type=int, default=None, help="tasks per set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="judge workers (default: the pool's)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds; then report what is judged")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report-only", action="store_true", help="judge nothing: the table of --out's verdicts")
    args = parser.parse_args()
    if args.report_only and not (args.out and args.out.with_suffix(".jsonl").is_file()):
        parser.error("--report-only needs --out with verdicts (its .jsonl)")
    scratch = Path(tempfile.mkdtemp(prefix="expert-ceiling-"))
    rng = random.Random(args.seed)
    jobs, skipped, shapes = [], defaultdict(int), {}
    sets = [[(data, task) for task in task_files(data, scratch / data.stem)[:args.limit]] for data in args.data]
    for data, task in [pair for turn in itertools.zip_longest(*sets) for pair in turn if pair]:
        try:
            program = trace(task.read_text())
        except Unsupported as exc:
            skipped[str(exc)] += 1
            continue
        family = "gemm" if program.gemm else "pointwise" if program.pointwise else \
            "long rows" if program.cols >= 1024 else "rows"
        shapes[task] = {"ops": program.ops, "cols": program.cols}
        settings = {"fast": FAST, **{f"random{j}": random_knobs(rng) for j in range(args.random)}}
        for name, knobs in settings.items():
            folder = scratch / "candidates" / data.stem / task.stem / name
            for path, text in workspace_files(program, args.backend, knobs).items():
                (folder / path).parent.mkdir(parents=True, exist_ok=True)
                (folder / path).write_text(text)
            repeats = args.repeats if name == "fast" or args.random_repeats is None else args.random_repeats
            jobs += [(data.stem, family, task, name, knobs, folder)] * repeats
    jobs = interleaved(jobs, 2 * (args.workers or 16))
    lines, deadline = [], time.monotonic() + (args.time_limit or math.inf)
    done: dict[tuple, int] = defaultdict(int)  # (set, task, knobs) -> verdicts judged before
    if args.out and args.out.with_suffix(".jsonl").is_file():
        lines = [json.loads(line) for line in args.out.with_suffix(".jsonl").read_text().splitlines() if line]
        named = {(job[0], job[2].stem): shapes[job[2]] for job in jobs}  # (set, task) -> its ops and row length
        for line in lines:
            done[line["set"], line["task"], line["knobs"]] += 1
            now = named.get((line["set"], line["task"]))
            if "ops" in line and now is not None and (line["ops"], line["cols"]) != (now["ops"], now["cols"]):
                parser.error(f"{line['set']}/{line['task']} was {line['ops']} on rows of {line['cols']} in --out's "
                             f"verdicts but is {now['ops']} on rows of {now['cols']} in --data: another task set")
        print(f"resumed: {len(lines)} verdicts judged before", flush=True)
    todo = []
    for job in jobs:
        key = (job[0], job[2].stem, job[3])
        if done[key]:
            done[key] -= 1
        else:
            todo.append(job)
    if not args.report_only:
        judge(todo, args, lines, len(jobs), deadline, shapes)
    shutil.rmtree(scratch, ignore_errors=True)
    runs: dict[tuple, list[dict]] = defaultdict(list)  # (set, family, task, knobs) -> its verdicts
    for line in lines:
        runs[line["set"], line["family"], line["task"], line["knobs"]].append(line)
    grouped: dict[tuple, dict[str, list[dict]]] = defaultdict(dict)
    best: dict[tuple, list[dict]] = {}
    for (label, family, task, knobs), verdicts in runs.items():
        grouped[label, family, "fast" if knobs == "fast" else "random"][f"{task}/{knobs}"] = verdicts
        score = (typical(verdicts)["reward"], typical(verdicts).get("speedup_vs_compile") or 0.0)
        current = best.get((label, family, task))
        if current is None or score > (typical(current)["reward"], typical(current).get("speedup_vs_compile") or 0.0):
            best[label, family, task] = verdicts
    for (label, family, task), verdicts in best.items():  # each task's best setting of those tried
        grouped[label, family, "best"][task] = verdicts
        grouped[label, "(all)", "best"][task] = verdicts  # the issue's headline: reward 3's share at the best knob
    rows = [summarise(*key, verdicts) for key, verdicts in sorted(grouped.items())]
    per = f"{args.repeats} verdicts per setting" if args.random_repeats in (None, args.repeats) else \
        f"{args.repeats} verdicts of the fast knobs, {args.random_repeats} of each random setting"
    phases = defaultdict(list)  # where an evaluation's time went, over the verdicts that say
    for line in lines:
        for name, seconds in (line.get("phases_s") or {}).items():
            phases[name].append(seconds)
    write(args.out, f"The expert's ceiling ({args.backend}, {per})", rows,
          ["set", "family", "knobs", "tasks", "correct", "reward>=2", "reward 3", "vs eager", "vs compile",
           "eager us", "compile us", "judged again", "stable", "s/verdict"],
          {"skipped": dict(skipped), "machine": machine(),
           "phases_median_s": {name: statistics.median(v) for name, v in sorted(phases.items())},
           "args": vars(args) | {"data": [str(d) for d in args.data], "out": str(args.out)}})

if __name__ == "__main__":
    main()
