"""What the op audit adds to one call of forward (on the cpu backend the timed calls run under it, strict policy).

A forward that allocates its output and fills it (what a candidate's binding does around its kernel), timed plainly
and inside the audit's dispatch mode, in one run.

    python benchmarks/audit_overhead.py --out audit_overhead.json
"""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

from _common import write

import torch

from cuda_agent.judge.candidate.audit import OpAudit
from cuda_agent.judge.config import DEFAULT_ALLOWED_OPS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    importlib.import_module("torch._dynamo")  # as the worker does before any audited call
    audit = OpAudit(DEFAULT_ALLOWED_OPS)
    rows = []
    for numel in (1 << 10, 1 << 20):
        x = torch.randn(numel)

        def forward() -> torch.Tensor:
            out = torch.empty_like(x)
            return out.fill_(1.0)

        def audited() -> torch.Tensor:
            with audit:
                return forward()

        timings = {}
        for name, fn in (("plain", forward), ("audited", audited)) * 2:  # twice, interleaved; the second counts
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            timings[name] = (time.perf_counter() - t0) / args.calls * 1e6
        rows.append({"elements": numel, "plain_us": timings["plain"], "audited_us": timings["audited"],
                     "overhead_us": timings["audited"] - timings["plain"]})
    write(args.out, "Op audit overhead per call (allocation + fill)", rows,
          ["elements", "plain_us", "audited_us", "overhead_us"], {"calls": args.calls})


if __name__ == "__main__":
    main()
