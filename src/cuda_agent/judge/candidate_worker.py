"""Candidate worker: loads the candidate, runs it on the judge's inputs under the op audit, then times it.

It never sees reference outputs. The judge sends one seed per trial (so no later input set is known in
advance); the worker draws that input set with the task's `get_inputs` (at other sizes for the extra-shape
trial), runs `ModelNew` under the op audit while the profiler watches every other thread, exports the outputs
(CUDA IPC handles or raw bytes) for the reference worker to compare, and reports fingerprints of the inputs as
the candidate left them. Timing waits for the judge's word; after it, a re-check writes fresh values into the
timed input buffers and runs one more trial on them.

Usage (by the judge): python -m cuda_agent.judge.candidate_worker REQUEST.json
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import torch

from ..backend import get_backend
from ..task import import_file
from .audit import OpAudit, ThreadAudit
from .integrity import Integrity
from .process import Channel, Handler, WorkerFailure, one_line, run_worker
from .tensors import checksum, leaves, make_inputs
from .transfer import export_outputs
from .timing import time_callable


def route_load_inline(cache_dir: Path) -> None:
    """Make `load_inline` build each distinct source once, in the judge's cache (keyed by content)."""
    from torch.utils import cpp_extension

    original = cpp_extension.load_inline
    signature = inspect.signature(original)

    def load_inline(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        params = {k: v for k, v in bound.arguments.items() if k not in ("name", "verbose", "build_directory")}
        key = hashlib.sha256(repr(sorted((k, repr(v)) for k, v in params.items())).encode()).hexdigest()[:16]
        bound.arguments["name"] = unique = f"{bound.arguments['name']}_{key}"
        build_dir = cache_dir / unique
        build_dir.mkdir(parents=True, exist_ok=True)
        bound.arguments["build_directory"] = str(build_dir)
        return original(*bound.args, **bound.kwargs)

    cpp_extension.load_inline = load_inline


def refill(buffers: list, fresh: list) -> list:
    """Write a fresh input set's values into existing input tensors (same addresses, new contents)."""
    for (_, old), (_, new) in zip(leaves(buffers, "input"), leaves(fresh, "input")):
        if isinstance(old, torch.Tensor):
            old.copy_(new)
    return buffers


def output_problems(out: Any, inputs: Any) -> list[str]:
    """Outputs must be plain tensors with their own storage (no proxies, no aliasing of inputs)."""
    problems = []
    input_ptrs = {x.untyped_storage().data_ptr() for _, x in leaves(inputs) if isinstance(x, torch.Tensor)}
    for path, leaf in leaves(out):
        if isinstance(leaf, torch.Tensor):
            if type(leaf) is not torch.Tensor:
                problems.append(f"{path} is a {type(leaf).__name__}, not a plain torch.Tensor")
            elif leaf.untyped_storage().data_ptr() in input_ptrs and leaf.numel() > 0:
                problems.append(f"{path} aliases an input tensor's memory")
        elif not isinstance(leaf, (int, float, bool, type(None))):
            problems.append(f"{path} is a {type(leaf).__name__}, not a tensor or number")
    return problems


class Candidate:
    def __init__(self, req: dict):
        self.req = req
        self.backend = get_backend(req["backend"])
        self.device = self.backend.device
        self.backend.precision_flags(req["allow_tf32"])
        build_dir = Path(req["build_dir"])
        if req["kind"] == "single_file":
            route_load_inline(Path(req["extension_cache"]))
        # The op audit's first dispatch from C++ imports torch._dynamo (1-3 s): import it now, while the reference
        # worker is still starting, instead of inside the first verified forward.
        importlib.import_module("torch._dynamo")
        self.integrity = Integrity((sys.modules[__name__],))  # before any candidate code runs
        try:
            model_cls = getattr(import_file(build_dir / "model_new.py", "model_new"), "ModelNew")
        except Exception as exc:
            raise WorkerFailure("load_error", f"loading the candidate failed: {one_line(exc)}") from exc
        self.model_cls = model_cls
        self.allowed_ops = tuple(req["allowed_ops"])
        self.audit = OpAudit(self.allowed_ops)
        # The task module only supplies get_inputs(): Model itself is never built in this process.
        self.task = import_file(req["task_path"], "task_inputs")

    def initialise(self, public: Path) -> None:
        """Build ModelNew with the reference's constructor arguments and weights (strict)."""
        init_inputs = torch.load(public / "init_inputs.pt", weights_only=True)
        state = torch.load(public / "state_dict.pt", weights_only=True)
        try:
            with torch.device(self.device):
                self.model = self.model_cls(*init_inputs).to(self.device).eval()
        except Exception as exc:
            raise WorkerFailure("verify_error", f"ModelNew(*get_init_inputs()) failed: {one_line(exc)}") from exc
        try:
            self.model.load_state_dict(state, strict=True)
        except Exception as exc:
            raise WorkerFailure("verify_error", f"ModelNew does not take Model's state dict (strict): {one_line(exc)}") \
                from exc

    def run_trial(self, k: int, seed: int, reuse: list | None = None, shapes: dict[str, int] | None = None,
                  scale: float | None = None) -> dict:
        """Run ModelNew on the input set of `seed` (at other sizes with `shapes`, scaled by `scale`), drawn fresh
        or, with `reuse`, written into those buffers."""
        with ThreadAudit(self.allowed_ops) as threads:  # until the outputs are exported: they must be final
            inputs = make_inputs(self.task, seed, self.device, shapes, scale)
            if reuse is not None:
                inputs = refill(reuse, inputs)
            try:
                with torch.no_grad(), self.audit:
                    out = self.model(*inputs)
                self.backend.synchronize()
            except Exception as exc:
                raise WorkerFailure("verify_error", f"ModelNew.forward failed on input set {k}: {one_line(exc)}") \
                    from exc
            self.last_outputs = out  # shared outputs must stay alive until the reference has compared them
            manifest = export_outputs(out, Path(self.req["out_dir"]) / f"trial{k}", self.req["cuda_ipc"])
        manifest_path = Path(self.req["out_dir"]) / f"trial{k}.json"
        manifest_path.write_text(json.dumps(manifest))
        return {"checksums_after": checksum(inputs),
                "problems": output_problems(out, inputs), "violations": self.audit.messages() + threads.messages(),
                "warnings": [] if threads.available else
                ["this torch cannot profile other threads: background-thread compute was not audited"]}

    def time(self, seed: int) -> dict:
        inputs = self.timed_inputs = make_inputs(self.task, seed, self.device)
        with torch.no_grad():
            return time_callable(lambda: self.model(*inputs), self.backend, **self.req["timing"])


def start(req: dict, chan: Channel) -> dict:
    cand = Candidate(req)
    check_integrity = cand.integrity.changed

    def checked(handler: Handler) -> Handler:
        def run(cmd: dict) -> tuple[str, dict]:
            reply = handler(cmd)
            replaced = check_integrity()
            if replaced:
                raise WorkerFailure("verify_error", "candidate code replaced functions the judge relies on: "
                                                    + ", ".join(replaced[:8]))
            return reply
        return run

    checked(lambda cmd: ("", {}))({})  # loading the candidate ran its module code
    chan.send("loaded")

    def initialise(cmd: dict) -> tuple[str, dict]:
        cand.initialise(Path(cmd["public_dir"]))
        return "initialised", {}

    return {
        "init": checked(initialise),
        "trial": checked(lambda cmd: ("trial_done", cand.run_trial(int(cmd["k"]), int(cmd["seed"]), None,
                                                                   cmd.get("shapes"), cmd.get("scale")))),
        "time": checked(lambda cmd: ("timed", {"stats": cand.time(int(cmd["seed"]))})),
        "recheck": checked(lambda cmd: ("trial_done", cand.run_trial(int(cmd["k"]), int(cmd["seed"]),
                                                                     cand.timed_inputs))),
    }


if __name__ == "__main__":
    run_worker(start, "verify_error")
