"""Reference worker: runs only the trusted task code, never candidate code.

It draws the input sets from the judge's seeds, computes the reference outputs in fp32 (the tolerance check)
and in fp64 (to measure fp32 eager's own error), writes inputs and weights where the candidate worker can read
them and outputs where it cannot, then times eager and torch.compile when the judge has no cached baseline.

Usage (by the judge): python -m cuda_agent.judge.reference_worker REQUEST.json
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from pathlib import Path

import torch

from ..backend import get_backend
from ..task import import_file
from .process import Channel
from .tensors import clone, detach_cpu, to_device, to_double
from .timing import time_callable


class ReferenceFailure(Exception):
    pass


def _step(what: str, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # the task itself is broken: report one clear line
        raise ReferenceFailure(f"{what} failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from exc


def run(req: dict, chan: Channel) -> None:
    backend = get_backend(req["backend"])
    device = backend.device
    precision = backend.precision_flags(req["allow_tf32"])
    module = _step("importing the reference", import_file, req["task_path"], "reference_task")
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, name):
            raise ReferenceFailure(f"the reference defines no {name}")

    torch.manual_seed(req["init_seed"])
    init_inputs = _step("get_init_inputs()", module.get_init_inputs)
    model = _step("building Model(*get_init_inputs())", lambda: module.Model(*init_inputs).to(device).eval())

    input_sets, outputs, outputs64 = [], [], []
    model64 = None
    with torch.no_grad():
        for seed in req["seeds"]:
            torch.manual_seed(seed)
            inputs = to_device(_step("get_inputs()", module.get_inputs), device)
            out = _step("Model.forward", lambda: model(*clone(inputs)))
            backend.synchronize()
            input_sets.append(detach_cpu(inputs))
            outputs.append(detach_cpu(out))
            try:
                if model64 is None:
                    model64 = copy.deepcopy(model).double()
                outputs64.append(detach_cpu(model64(*to_double(clone(inputs)))))
            except Exception:  # some ops have no fp64 kernel: the error baseline is then unknown
                outputs64.append(None)

    public, private = Path(req["public_dir"]), Path(req["private_dir"])
    torch.save({"init_inputs": list(init_inputs), "inputs": input_sets}, public / "inputs.pt")
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, public / "state_dict.pt")
    torch.save({"outputs": outputs, "outputs64": outputs64}, private / "reference.pt")
    chan.send("ready", device=backend.describe_device(), torch_version=torch.__version__, precision=precision)

    if chan.receive().get("command") != "time":  # the judge has these baselines cached
        return
    timing = req["timing"]
    inputs = to_device(input_sets[0], device)
    with torch.no_grad():
        eager = time_callable(lambda: model(*inputs), backend, **timing)
        compiled_stats, compile_error = None, None
        try:
            compiled = torch.compile(model, mode=None if req["compile_mode"] == "default" else req["compile_mode"])
            compiled_stats = time_callable(lambda: compiled(*inputs), backend, **timing)
        except Exception as exc:
            compile_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    chan.send("baselines", eager=eager, compile=compiled_stats, compile_error=compile_error)


def main() -> None:
    req = json.loads(Path(sys.argv[1]).read_text())
    chan = Channel()
    try:
        run(req, chan)
    except ReferenceFailure as exc:
        chan.send("task_error", error=str(exc))
    except Exception as exc:
        traceback.print_exc()
        chan.send("task_error", error=f"reference worker failed: {type(exc).__name__}: {exc}")
    chan.send("done")


if __name__ == "__main__":
    main()
