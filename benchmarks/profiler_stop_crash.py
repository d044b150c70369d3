"""How often torch's all-threads profiler (the op audit's, `judge/candidate/audit.py`) crashes when it stops while
other threads run torch ops: `--runs` processes, each starting `--threads` threads that multiply small matrices
without pause and then starting and stopping the profiler `--stops` times, as the audit does. Reports the crashed
processes (a signal) and the stops they reached. This is the judge's known intermittent SIGSEGV at the profiler's
`__exit__` (docs/judge.md), reproduced without a GPU; the judge answers it by judging a signal-killed candidate once
more in a fresh process.

    python3 benchmarks/profiler_stop_crash.py [--runs 3] [--stops 2000] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from _common import write

CHILD = """
import sys, threading, torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile

ended = threading.Event()

def busy():
    x = torch.randn(64, 64)
    while not ended.is_set():
        torch.mm(x, x)

threads = [threading.Thread(target=busy) for _ in range(int(sys.argv[2]))]
for thread in threads:
    thread.start()
y = torch.zeros(1)
for i in range(int(sys.argv[1])):
    prof = profile(activities=[ProfilerActivity.CPU], experimental_config=_ExperimentalConfig(profile_all_threads=True))
    prof.__enter__()
    torch.lerp(y, y, 0.5)
    prof.__exit__(None, None, None)
    print(i + 1, flush=True)
ended.set()
for thread in threads:
    thread.join()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stops", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2, help="threads running ops (0: none)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for run in range(args.runs):
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.stops), str(args.threads)], capture_output=True,
                              text=True)
        reached = int(done.stdout.split()[-1]) if done.stdout.split() else 0
        rows.append({"run": run, "threads": args.threads, "stops": reached, "crashed": done.returncode < 0,
                     "signal": -done.returncode if done.returncode < 0 else None,
                     "seconds": round(time.perf_counter() - began, 1)})
        print(rows[-1], flush=True)
    crashed = sum(r["crashed"] for r in rows)
    write(args.out, f"torch's all-threads profiler stopped beside {args.threads} busy threads: {crashed} of "
          f"{args.runs} processes crashed in {sum(r['stops'] for r in rows)} stops", rows,
          ["run", "threads", "stops", "crashed", "signal", "seconds"], {"args": vars(args) | {"out": str(args.out)}})


if __name__ == "__main__":
    main()
