"""Evaluations per hour: one evaluation at a time (a lone Judge) against the JudgePool, on the same work, each with
its own empty cache (but MODE-again and --one-cache), side by side in one run. Also the timing agreement (a
candidate's median in the pool vs alone) and the warm-reference latency (the same task judged again).

The agreement is given for the candidate's median and for its speedup over eager (a drift of the machine's speed
between modes moves both times, not their ratio). Each mode's row also says where the time went: the timing
phase's parts (baselines, the candidate, its checked calls, eager checks), the CPUs' busy share and each device
lock's states (exclusive, shared, draining, free).

Work: (a) KernelBench references judged as their own candidates (`ModelNew = Model`, --policy kernelbench: no
build, verify + time), a sample spread over the levels; (b) distinct copies of a one-kernel workspace (build heavy).

    python benchmarks/judge_throughput.py --backend cuda --kernelbench DIR --tasks 12 --workspaces 12 \
        --modes serial,pool --out throughput.json     # add pool2 (--gpus 0,1) on a 2-GPU machine
    # all 250 references, half per call, cold then again with the baselines cached (as a second suite run):
    python benchmarks/judge_throughput.py --kernelbench DIR --tasks 250 --part 1/2 --workspaces 0 \
        --modes pool,pool-again
    # the timing agreement with the baselines cached for the lone judge (no torch.compile to wait for):
    python benchmarks/judge_throughput.py --kernelbench DIR --tasks 16 --workspaces 0 --modes pool,serial --one-cache
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path

from _common import ROOT, write

from cuda_agent.judge import Judge, JudgeConfig
from cuda_agent.judge.pool import JudgePool

WORKSPACE = {"cuda": ("affine_relu_cuda", "kernels/affine_relu.cu"),
             "cpu": ("affine_relu_ok", "kernels/affine_relu.cpp")}
WARM_TASKS = ("level2/12_Gemm_Multiply_LeakyReLU.py,level2/40_Matmul_Scaling_ResidualAdd.py,"
              "level2/52_Conv2d_Activation_BatchNorm.py")
TASK = ROOT / "tests" / "data" / "tasks" / "affine_relu.py"


def kernelbench_work(root: Path, count: int, folder: Path, part: str = "1/1") -> list[tuple[Path, Path]]:
    """`count` references spread evenly over levels 1-3, each with itself as the candidate, in a fixed shuffled
    order; `part` K/N keeps every N-th of them from the K-th (a run too long for one call, split over N)."""
    tasks = sorted(p for level in ("level1", "level2", "level3") for p in (root / level).glob("*.py"))
    picked = [tasks[round(i * (len(tasks) - 1) / max(1, count - 1))] for i in range(count)] if count else []
    work = []
    for task in dict.fromkeys(picked):
        cand = folder / f"{task.parent.name}_{task.name}"
        cand.write_text(task.read_text() + "\n\nModelNew = Model\n")
        work.append((task, cand))
    random.Random(0).shuffle(work)  # the levels mixed: a run stopped by --time-limit still samples all three
    k, n = (int(x) for x in part.split("/"))
    if not 1 <= k <= n:
        raise SystemExit(f"--part must be K/N with 1 <= K <= N, not {part}")
    return work[k - 1::n]


def workspace_work(backend: str, count: int, folder: Path) -> list[tuple[Path, Path]]:
    """`count` copies of the test workspace, each kernel source distinct (so each one builds)."""
    name, kernel = WORKSPACE[backend]
    work = []
    for i in range(count):
        ws = folder / f"ws{i}"
        shutil.copytree(ROOT / "tests" / "data" / "candidates" / name, ws)
        (ws / kernel).write_text((ws / kernel).read_text() + f"\n// variant {i}\n")
        work.append((TASK, ws))
    return work


def cpu_times() -> tuple[float, float]:
    """The machine's busy and total CPU time so far (/proc/stat; zeros where there is none)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def run_mode(mode: str, backend: str, work: dict[int, tuple[Path, Path]], cache: Path, workers: int | None,
             gpus: list[int], time_limit: float | None) -> tuple[float, dict, dict]:
    """Judge `work` (by index) in `mode`: the seconds taken, the verdicts by work index and how the time went
    (the CPUs' busy share, each device lock's states). Past `time_limit` seconds nothing new starts (the rate is
    then over what finished)."""
    config = JudgeConfig(cache_dir=cache, policy="kernelbench")
    start, cpu_start = time.perf_counter(), cpu_times()
    verdicts, usage = {}, {}

    def done(index: int, verdict) -> None:
        verdicts[index] = verdict
        phases = " ".join(f"{k}={t:.1f}" for k, t in verdict.phases_s.items() if t >= 0.5)
        again = " (judged again alone)" if any("judged again alone" in w for w in verdict.warnings) else ""
        print(f"[{mode} {time.perf_counter() - start:6.1f} s] {len(verdicts)}/{len(work)} {verdict.task['name']} "
              f"{'ok' if verdict.correct else 'FAILED: ' + (verdict.error or '')[:200]}{again} "
              f"{verdict.seconds:.1f} s {phases}", flush=True)

    kind = mode.removesuffix("-again")
    if kind == "serial":
        with Judge(backend, config) as judge:
            for index, (task, cand) in work.items():
                if time_limit and time.perf_counter() - start > time_limit:
                    break
                done(index, judge.evaluate(task, cand))
            usage["locks"] = [judge.device_lock.seconds()]
    else:
        devices = gpus if kind == "pool2" else gpus[:1]
        with JudgePool(backend, config, devices=devices or None, workers=workers) as pool:
            futures = [pool.submit(task, cand) for task, cand in work.values()]
            for index, future in zip(work, futures):
                future.add_done_callback(lambda f, i=index: f.cancelled() or f.exception() or done(i, f.result()))
            if time_limit:
                wait(futures, timeout=max(0.0, time_limit - (time.perf_counter() - start)))
                for future in futures:
                    future.cancel()  # those not started; those in flight finish
            wait(futures)
            for future in futures:
                if not future.cancelled() and future.exception():
                    print(f"[{mode}] an evaluation raised: {future.exception()}", flush=True)
            usage["locks"] = [judge.device_lock.seconds() for judge in pool.judges]
    (busy, total), (busy0, total0) = cpu_times(), cpu_start
    usage["cpu_busy_pct"] = round(100 * (busy - busy0) / (total - total0)) if total > total0 else None
    return time.perf_counter() - start, verdicts, usage


def device_seconds(verdicts: list, phases: tuple[str, ...] = ("timing",)) -> float:
    """Seconds spent in `phases`, summed over the verdicts: by default holding a device exclusively (timing;
    verification holds it shared, beside other verifications and compiles' runs)."""
    return sum(t for v in verdicts for k, t in v.phases_s.items() if k in phases)


def timing_parts(verdicts: list) -> str:
    """Where the timing phase's seconds went, summed over the verdicts (the timekeeper's record)."""
    parts: dict[str, float] = {}
    for v in verdicts:
        for part, t in ((v.timing or {}).get("baselines") or {}).get("seconds", {}).items():
            parts[part] = parts.get(part, 0.0) + t
    return " ".join(f"{part}={t:.1f}" for part, t in parts.items())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda", choices=sorted(WORKSPACE))
    ap.add_argument("--kernelbench", type=Path, help="KernelBench problems folder (level1/ ...)")
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--part", default="1/1", help="K/N: every N-th of the KernelBench work from the K-th")
    ap.add_argument("--workspaces", type=int, default=12)
    ap.add_argument("--modes", default="serial,pool", help="serial, pool (one device), pool2 (two GPUs); MODE-again: "
                    "MODE once more on the cache MODE left (baselines and builds cached, as for a second suite)")
    ap.add_argument("--one-cache", action="store_true", help="every mode on the cache the modes before it left "
                    "(e.g. pool,serial: the candidates alone with the baselines cached, for the timing agreement)")
    ap.add_argument("--workers", type=int, help="pool workers (default: JudgePool's)")
    ap.add_argument("--gpus", default="0,1")
    ap.add_argument("--time-limit", type=float, help="seconds per mode: start nothing after it, rate over what ended")
    ap.add_argument("--warm-tasks", default=WARM_TASKS, help="level 2 tasks (comma-separated) judged cold then warm")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="judge-throughput-"))
    (tmp / "kb").mkdir()
    sets = {"workspaces": workspace_work(args.backend, args.workspaces, tmp)}
    if args.kernelbench:
        sets["kernelbench"] = kernelbench_work(args.kernelbench, args.tasks, tmp / "kb", args.part)
    sets = {name: work for name, work in sets.items() if work}
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()] if args.backend == "cuda" else []
    rows, medians = [], {}
    modes = args.modes.split(",")
    for name, work in sets.items():
        todo, finished = dict(enumerate(work)), {}
        for mode in modes:
            if mode.endswith("-again"):  # what its mode finished (the baselines of the rest were never cached)
                todo = {i: work[i] for i in finished.get(mode.removesuffix("-again"), todo)}
            # -again: the cache its mode left; --one-cache: the one all the modes before left
            cache = tmp / (f"cache-{name}" if args.one_cache else f"cache-{name}-{mode.removesuffix('-again')}")
            seconds, verdicts, usage = run_mode(mode, args.backend, todo, cache, args.workers, gpus,
                                                args.time_limit)
            finished[mode] = sorted(verdicts)
            if args.one_cache:  # the next modes judge what this one finished (their baselines are cached)
                todo = {i: work[i] for i in finished[mode]}
            medians[(name, mode)] = {i: (v.task["name"], v.times_us["candidate"], v.times_us.get("eager"))
                                     for i, v in verdicts.items()}
            verdicts = list(verdicts.values())
            rows.append({"work": name, "mode": mode, "evaluations": len(verdicts), "seconds": round(seconds, 1),
                         "per_hour": round(3600 * len(verdicts) / seconds), "passed": sum(v.correct for v in verdicts),
                         "device_s": round(device_seconds(verdicts), 1),
                         "verify_s": round(device_seconds(verdicts, ("verify",)), 1),
                         "timing_parts_s": timing_parts(verdicts), "cpu_busy_pct": usage["cpu_busy_pct"],
                         "device_lock_s": " | ".join(" ".join(f"{k}={t:.0f}" for k, t in lock.items())
                                                     for lock in usage["locks"]),
                         "notes": "; ".join(f"{v.task['name']}: {(v.error or '')[:300]}" for v in verdicts
                                            if not v.correct)})
            print(rows[-1], flush=True)
        base = rows[-len(modes)]
        for row in rows[-len(modes):]:
            row["speedup_vs_first"] = round(row["per_hour"] / base["per_hour"], 2) if base["per_hour"] else None
            first, this = medians[(name, base["mode"])], medians[(name, row["mode"])]
            both = [(first[i], this[i]) for i in first.keys() & this.keys() if first[i][1] and this[i][1]
                    and first[i][1] >= 100]
            gaps = sorted((abs(b[1] / a[1] - 1), a[0], a[1], b[1]) for a, b in both)
            row["timing_gap_pct_median"] = round(100 * statistics.median(g[0] for g in gaps), 1) if gaps else None
            row["timing_gap_pct_max"] = round(100 * gaps[-1][0], 1) if gaps else None
            # the same for the speedup over eager (what the verdict claims): a drift of the machine's speed between
            # the modes moves both times, not their ratio
            ratios = sorted(abs((b[2] / b[1]) / (a[2] / a[1]) - 1) for a, b in both if a[2] and b[2])
            row["speedup_gap_pct_median"] = round(100 * statistics.median(ratios), 1) if ratios else None
            row["speedup_gap_pct_max"] = round(100 * ratios[-1], 1) if ratios else None
            if gaps and row is not base:
                row["notes"] += f" largest timing gap: {gaps[-1][1]} {gaps[-1][2]:.0f} vs {gaps[-1][3]:.0f} us"
    # the warm-reference latency: each of a few level 2 tasks judged twice by one judge (the second finds it warm)
    for name in filter(None, args.warm_tasks.split(",") if args.kernelbench else []):
        task = args.kernelbench / name
        cand = tmp / "kb" / f"warm_{task.name}"
        cand.write_text(task.read_text() + "\n\nModelNew = Model\n")
        with Judge(args.backend, JudgeConfig(cache_dir=tmp / "cache-warm", policy="kernelbench")) as judge:
            first, second = judge.evaluate(task, cand), judge.evaluate(task, cand)
        for label, v in (("cold", first), ("warm reference", second)):
            rows.append({"work": name, "mode": label, "evaluations": 1, "seconds": v.seconds,
                         "passed": int(v.correct), "device_s": round(device_seconds([v]), 1),
                         "notes": " ".join(f"{k}={t:.1f}" for k, t in v.phases_s.items())})
            print(rows[-1], flush=True)
    write(args.out, f"Judge throughput ({args.backend})", rows,
          ["work", "mode", "evaluations", "seconds", "per_hour", "speedup_vs_first", "passed", "device_s", "verify_s",
           "timing_parts_s", "cpu_busy_pct", "device_lock_s", "timing_gap_pct_median", "timing_gap_pct_max",
           "speedup_gap_pct_median", "speedup_gap_pct_max", "notes"],
          {"backend": args.backend})
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
