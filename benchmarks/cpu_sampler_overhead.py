"""What the trusted CPU sampler costs the calls it watches (judge/trusted/cpu_sampler.py), at several periods.

Every call of a sampled callee is watched (the candidate's under strict, and the baselines' beside it, so both pay
the same), so what sampling costs a call must stay small. This times a fixed piece of work (a pointwise chain on
2^20 floats, torch's threads as the judge leaves them) in a child process, in alternating rounds without the
sampler and with its events (opened once, on the stopped process, and drained and placed after every round, as
the judge does around its calls), and reports, per period, the ratio of the medians.

    python3 benchmarks/cpu_sampler_overhead.py [--periods-us 250,1000] [--rounds 20] [--iters 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import write

from cuda_agent.judge.trusted import cpu_sampler

CHILD = """
import sys, time, torch
x = torch.randn(1 << 20)
for line in sys.stdin:
    began = time.perf_counter()
    for _ in range(int(line)):
        torch.relu(x * 2.0 + 0.1)
    print(time.perf_counter() - began, flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--periods-us", default="250,1000")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    why = cpu_sampler.unavailable()
    if why:
        sys.exit(f"no sampler here: {why}")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})

    def round_s() -> float:
        child.stdin.write(f"{args.iters}\n")
        child.stdin.flush()
        return float(child.stdout.readline())

    round_s()  # torch's threads started, caches warm
    rows = []
    for period_us in (int(p) for p in args.periods_us.split(",")):
        times: dict[str, list[float]] = {"plain": [], "sampled": []}
        samples = 0
        for r in range(args.rounds):
            for mode in (("plain", "sampled") if r % 2 else ("sampled", "plain")):
                if mode == "plain":
                    times[mode].append(round_s())
                    continue
                os.kill(child.pid, signal.SIGSTOP)  # opened on a stopped process, as before a call
                sampler = cpu_sampler.CpuSampler(child.pid, [], period_ns=period_us * 1000)
                sampler.arm()
                os.kill(child.pid, signal.SIGCONT)
                times[mode].append(round_s())
                sampler.collect()
                samples += sum(sampler.counts.values())
                sampler.close()
        plain, sampled = statistics.median(times["plain"]), statistics.median(times["sampled"])
        rows.append({"period_us": period_us, "plain_ms_per_iter": round(plain / args.iters * 1e3, 4),
                     "sampled_ms_per_iter": round(sampled / args.iters * 1e3, 4),
                     "sampled_over_plain": round(sampled / plain, 4), "samples": samples})
    child.stdin.close()
    child.wait()
    write(args.out, "CPU sampler overhead", rows, ["period_us", "plain_ms_per_iter", "sampled_ms_per_iter",
                                                   "sampled_over_plain", "samples"],
          {"rounds": args.rounds, "iters": args.iters,
           "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})


if __name__ == "__main__":
    main()
