"""torch.compile's first run with many at once, as in a judge pool's cold run: inductor's own compile workers
(TORCHINDUCTOR_COMPILE_THREADS unset: one subprocess pool of up to 32 per process) against the cores shared out
(the pool's setting: cores / evaluations in flight), side by side in one run, variants alternating per round.

Each round of a variant starts --processes processes at once, each compiling a different KernelBench reference on
the GPU from an empty inductor (and Triton) cache and timing its first run; the row says the wall time until the
last ended, the median and slowest first run, the CPUs' busy share and the least host memory available meanwhile.

    python benchmarks/compile_threads.py --kernelbench DIR --processes 16 --rounds 2 --out compile_threads.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import write
from judge_throughput import cpu_times, kernelbench_work


def child(task: Path, device: str) -> None:
    """Compile `task`'s model and print the first run's seconds (one JSON line)."""
    import torch

    from cuda_agent.judge.wire.tensors import make_inputs
    from cuda_agent.task import import_file

    module = import_file(task, "reference")
    with torch.no_grad():
        model = module.Model(*module.get_init_inputs()).to(device).eval()
        inputs = make_inputs(module, 0, device)
        start = time.perf_counter()
        try:
            torch.compile(model)(*inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            error = None
        except Exception as exc:  # an out-of-memory beside the others is reported, not fatal
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    print(json.dumps({"seconds": time.perf_counter() - start, "error": error}), flush=True)


def memory_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def one_round(tasks: list[Path], threads: int | None, folder: Path, device: str) -> dict:
    """All of `tasks` compiled at once, each in its own process with an empty cache."""
    least, stop = [memory_available_gb()], threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            least[0] = min(least[0], memory_available_gb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start, cpu_start = time.perf_counter(), cpu_times()
    procs = []
    for i, task in enumerate(tasks):
        cache = tempfile.mkdtemp(dir=folder, prefix=f"inductor{i}-")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": f"{cache}/triton"}
        env.pop("TORCHINDUCTOR_COMPILE_THREADS", None)
        if threads:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", str(task), "--device", device], env=env,
                                      stdout=subprocess.PIPE, text=True))
    results = []
    for task, proc in zip(tasks, procs):
        out = proc.communicate()[0].strip().splitlines()
        result = json.loads(out[-1]) if out else {"seconds": None, "error": f"exit {proc.returncode}"}
        results.append(result)
        if result["error"]:
            print(f"  {task.parent.name}/{task.name}: {result['error']}", flush=True)
    wall = time.perf_counter() - start
    stop.set()
    (busy, total), (busy0, total0) = cpu_times(), cpu_start
    firsts = [r["seconds"] for r in results if not r["error"]]
    return {"wall_s": round(wall, 1), "first_run_median_s": round(statistics.median(firsts), 1) if firsts else None,
            "first_run_max_s": round(max(firsts), 1) if firsts else None, "failed": len(results) - len(firsts),
            "cpu_busy_pct": round(100 * (busy - busy0) / (total - total0)) if total > total0 else None,
            "least_memory_available_gb": round(least[0], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernelbench", type=Path)
    ap.add_argument("--processes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.device)
    if not args.kernelbench:
        raise SystemExit("--kernelbench DIR is needed")
    cores = os.cpu_count() or 1
    shared = max(1, cores // args.processes)
    folder = Path(tempfile.mkdtemp(prefix="compile-threads-"))
    # a different spread of references per round (each compiles cold anyway), the same for both variants
    work = [task for task, _ in kernelbench_work(args.kernelbench, args.processes * args.rounds, folder)]
    rows = []
    for r in range(args.rounds):
        tasks = work[r * args.processes:(r + 1) * args.processes]
        variants = [("inductor's default", None), (f"shared: {shared} per process", shared)]
        for label, threads in variants if r % 2 == 0 else variants[::-1]:  # neither always goes first
            row = {"round": r + 1, "compile threads": label, "processes": len(tasks),
                   **one_round(tasks, threads, folder, args.device)}
            rows.append(row)
            print(row, flush=True)
    write(args.out, "torch.compile first runs at once", rows,
          ["round", "compile threads", "processes", "wall_s", "first_run_median_s", "first_run_max_s", "failed",
           "cpu_busy_pct", "least_memory_available_gb"], {"cores": cores})


if __name__ == "__main__":
    main()
