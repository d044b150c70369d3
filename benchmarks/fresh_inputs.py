"""What fresh input values before every timed call cost, and whether they change what is measured.

The judge writes a new input set into the timed buffers before every call (so no call can be served from memory).
This times eager PyTorch on the same tasks both ways, interleaved in one run: the timing loop with the same inputs
every call (as before) and with fresh ones, reporting the medians (accuracy: they should agree) and the wall time
each timing took (cost).

    python benchmarks/fresh_inputs.py --backend cuda --out fresh_inputs.json [--kernelbench DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _common import ROOT, write

import torch

from cuda_agent.backend import get_backend
from cuda_agent.judge.trusted.reference_worker import FreshInputs
from cuda_agent.judge.wire.tensors import make_inputs
from cuda_agent.judge.wire.timing import Hooks, time_callable
from cuda_agent.task import import_file

TASKS = [ROOT / "tests" / "data" / "tasks" / "affine_relu.py"]
KERNELBENCH = ["level1/19_ReLU.py", "level1/1_Square_matrix_multiplication_.py", "level1/23_Softmax.py",
               "level2/1_Conv2D_ReLU_BiasAdd.py"]
TIMING = {"warmup": 5, "min_iters": 10, "max_iters": 100, "target_time_s": 0.3}


class SameInputs(Hooks):
    def __init__(self, inputs: list):
        self.inputs = inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--kernelbench", type=Path, help="KernelBench problems folder (adds a few real tasks)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    backend = get_backend(args.backend)
    tasks = TASKS + ([args.kernelbench / t for t in KERNELBENCH if (args.kernelbench / t).exists()]
                     if args.kernelbench else [])
    rows = []
    for path in tasks:
        module = import_file(path, "bench_task")
        torch.manual_seed(0)
        with torch.device(backend.device):
            model = module.Model(*module.get_init_inputs()).to(backend.device).eval()
        results: dict[str, list] = {"same": [], "fresh": []}
        for _ in range(args.rounds):  # interleaved: machine noise hits both alike
            for kind in ("same", "fresh"):
                hooks = SameInputs(make_inputs(module, 1, backend.device)) if kind == "same" else \
                    FreshInputs(module, backend.device, backend)
                t0 = time.perf_counter()
                with torch.no_grad():
                    stats = time_callable(lambda: model(*hooks.inputs), backend, **TIMING, hooks=hooks)  # noqa: F821 (ruff 0.17)
                results[kind].append((stats["median_us"], time.perf_counter() - t0, stats["iters"]))
        same = statistics.median(r[0] for r in results["same"])
        fresh = statistics.median(r[0] for r in results["fresh"])
        rows.append({"task": path.name, "same_inputs_us": same, "fresh_inputs_us": fresh, "ratio": fresh / same,
                     "same_wall_s": statistics.median(r[1] for r in results["same"]),
                     "fresh_wall_s": statistics.median(r[1] for r in results["fresh"]),
                     "iters": results["fresh"][-1][2]})
        del model
    write(args.out, f"Fresh inputs before every timed call ({args.backend})", rows,
          ["task", "same_inputs_us", "fresh_inputs_us", "ratio", "same_wall_s", "fresh_wall_s", "iters"],
          {"backend": args.backend, "timing": TIMING})


if __name__ == "__main__":
    main()
