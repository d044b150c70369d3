"""The expert's row kernels against eager and torch.compile, by row length (issue 31): for each task of the rows
family at a row length from 16 to 16,384 elements (64 Mi floats in, so every run is bound by memory), its kernel
under each knob setting is built with the judge's builder, checked against eager's output, and timed beside eager and
torch.compile in one process (CUDA events around each call, the median of `--iters`). Reported per task and setting:
microseconds, the speedup over compile, and the bytes moved per second counting one read of the input and one write
of the output (what a kernel that reads each row once attains).

    python3 benchmarks/expert_rows.py [--only NAME] [--iters 20] [--out docs/data/expert_rows_h200.json]

This is the development loop for the rows kernels; the judge's own numbers come from benchmarks/expert_ceiling.py.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from _common import write

import torch

from cuda_agent.backend import get_backend
from cuda_agent.data.taskfile import load
from cuda_agent.rl.expert.kernels import FAST, MAX_PARAMS, NAME, workspace_files
from cuda_agent.rl.expert.trace import trace
from cuda_agent.workspace.build import Builder
from cuda_agent.workspace.candidate import load_candidate

ELEMENTS = 1 << 26
TASKS = {  # name -> (forward lines, constructor lines, row lengths)
    "gelu_softmax_relu": (["F.gelu(x)", "torch.softmax(x, dim=-1)", "torch.relu(x)"], [],
                          (16, 32, 256, 1024, 4096, 16384)),
    "tanh_layer_norm_silu": (["torch.tanh(x)", "self.op0(x)", "F.silu(x)"], ["self.op0 = nn.LayerNorm({cols})"],
                             (256, 4096)),
    "abs_sum": (["torch.abs(x)", "torch.sum(x, dim=-1)"], [], (256, 4096)),
    "log_softmax": (["torch.log_softmax(x * 3.0, dim=-1)", "x - 1.0"], [], (32, 8192)),
    "l2_normalise": (["x / (x.norm(dim=-1, keepdim=True) + 1e-6)"], [], (1024,)),
}
SETTINGS = {"fast": FAST, "streaming": replace(FAST, registers=False), "two_pass": replace(FAST, online=False)}


def source(forward: list[str], init: list[str], cols: int) -> str:
    body = "".join(f"        {line.format(cols=cols)}\n" for line in init) or "        pass\n"
    calls = "".join(f"        x = {line}\n" for line in forward)
    return ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass Model(nn.Module):\n"
            f"    def __init__(self):\n        super().__init__()\n{body}\n    def forward(self, x):\n{calls}"
            f"        return x\n\n\ndef get_inputs():\n    return [torch.randn({ELEMENTS // cols}, {cols})]\n\n\n"
            "def get_init_inputs():\n    return []\n")


class Params(ctypes.Structure):
    _fields_ = [("p", ctypes.c_void_p * MAX_PARAMS)]


def launcher(path: Path):
    """The kernel's launcher in a built workspace (through ctypes: Python imports only one `cuda_extension`)."""
    fn = getattr(ctypes.CDLL(str(path)), f"{NAME}_launcher")
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, Params, ctypes.c_int,
                   ctypes.c_void_p]
    return fn


def median_us(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="tasks whose name contains this")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="expert-rows-"))
    builder = Builder(get_backend("cuda"), scratch / "cache")
    jobs = []  # (task name, cols, task source, program, setting name, workspace folder)
    for name, (forward, init, lengths) in TASKS.items():
        for cols in lengths:
            if args.only and args.only not in name:
                continue
            text = source(forward, init, cols)
            program = trace(text)
            for setting, knobs in SETTINGS.items():
                folder = scratch / f"{name}_{cols}_{setting}"
                for path, content in workspace_files(program, "cuda", knobs).items():
                    (folder / path).parent.mkdir(parents=True, exist_ok=True)
                    (folder / path).write_text(content)
                jobs.append((name, cols, text, program, setting, folder))
    with ThreadPoolExecutor(max_workers=4) as pool:
        built = list(pool.map(lambda job: builder.build(load_candidate(job[5]), job[5] / "build"), jobs))
    rows, models = [], {}
    for (name, cols, text, program, setting, _), result in zip(jobs, built):
        if (name, cols) not in models:
            module = load(text)
            torch.manual_seed(0)
            model = module.Model().cuda()
            for p in model.parameters():
                torch.nn.init.normal_(p)
            x = module.get_inputs()[0].cuda()
            with torch.no_grad():
                expected = model(x)
                compiled = torch.compile(model)
                times = {"eager": median_us(lambda: model(x), args.iters),
                         "compile": median_us(lambda: compiled(x), args.iters)}
            models[name, cols] = (model, x, expected, times)
        model, x, expected, times = models[name, cols]
        row = {"task": name, "cols": cols, "knobs": setting, "eager us": times["eager"],
               "compile us": times["compile"]}
        if not result.ok:
            rows.append({**row, "error": result.error})
            print(row, result.error, flush=True)
            continue
        fn, params, got = launcher(result.module_path), Params(), torch.empty_like(expected)
        for i, (p, _) in enumerate(program.params):
            params.p[i] = model.get_parameter(p).data_ptr()
        stream = torch.cuda.current_stream().cuda_stream
        call = lambda: fn(got.data_ptr(), x.data_ptr(), x.numel() // cols, cols, params, 0, stream)  # noqa: E731
        call()
        bytes_moved = (x.numel() + expected.numel()) * 4
        us = median_us(call, args.iters)
        row.update({"us": us, "vs compile": times["compile"] / us, "vs eager": times["eager"] / us,
                    "max error": f"{(got - expected).abs().max().item():.1e}", "GB/s": bytes_moved / us / 1e3,
                    "compile GB/s": bytes_moved / times["compile"] / 1e3})
        rows.append(row)
        print(row, flush=True)
    write(args.out, "The expert's row kernels by row length (64 Mi floats in)", rows,
          ["task", "cols", "knobs", "eager us", "compile us", "us", "vs compile", "vs eager", "GB/s", "compile GB/s",
           "max error", "error"], {"elements": ELEMENTS, "settings": {k: asdict(v) for k, v in SETTINGS.items()}})


if __name__ == "__main__":
    main()
