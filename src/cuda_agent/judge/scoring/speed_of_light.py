"""The least work a task needs, and the fastest any implementation could do it on a device (speed of light).

`count_work` runs the reference once under a dispatch mode that records, per precision, the FLOPs of its
matmuls and convolutions, and the bytes of its inputs and outputs. Matmul FLOPs count only products of non-zero
operands (sum over k of nnz(A[:, k]) * nnz(B[k, :])), so a structurally sparse operand (`diag(a) @ b`, triangular
matrices) does not make an honest shortcut look impossible.

`bounds` turns the work into times at the device's peak rates for the precision the judge permits: fp32 matmuls
run at the fp32 (non-tensor-core) rate unless TF32 is allowed. Two of them are hard limits (`hard_problem`):
- writing the non-zero outputs at peak bandwidth: no kernel returns correct outputs faster (with a margin of 2);
- the FLOPs at the permitted precision's peak, when the candidate's error against fp64 is also far above fp32
  eager's own: together they say it computed in a lower precision than allowed (TF32 or fp16 with TF32 off).
Beating the full bound (all inputs read, all outputs written, all FLOPs) is only a warning: algebra can remove
work (`sum(x @ W.T)` needs one matrix-vector product).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..wire.tensors import leaves, tensor_bytes

OUTPUT_MARGIN = 2.0
_PRECISION = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
              torch.int8: "int8", torch.uint8: "int8", torch.complex64: "fp32", torch.complex128: "fp64"}
_MM = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}  # op -> positions of A and B


def _useful_mm_flops(a: torch.Tensor, b: torch.Tensor) -> int:
    """2 * sum over k of nnz(A[..., :, k]) * nnz(B[..., k, :]): the products any algorithm must form."""
    cols = (a != 0).sum(-2).double()  # (..., k)
    rows = (b != 0).sum(-1).double()  # (..., k)
    return int(2 * (cols * rows).sum().item())


class WorkCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.flops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args: tuple = (), kwargs: dict | None = None):
        from torch.utils.flop_counter import flop_registry

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        name = packet.__name__
        if name in _MM:
            a, b = (args[i] for i in _MM[name])
            count = _useful_mm_flops(a, b)
        elif packet in flop_registry:
            count = int(flop_registry[packet](*args, **kwargs, out_val=out))
        else:
            return out
        first = next((x for x in args if isinstance(x, torch.Tensor)), None)
        key = _PRECISION.get(first.dtype, "fp32") if first is not None else "fp32"
        self.flops[key] = self.flops.get(key, 0) + count
        return out


def count_work(run, inputs: list) -> tuple[Any, dict[str, Any]]:
    """Run `run(inputs)` once, counting; returns its outputs and the work (FLOPs None when they cannot be told)."""
    try:
        with WorkCounter() as counter:
            out = run(inputs)
        flops: dict[str, int] | None = counter.flops
    except Exception:  # an op the counter cannot follow: run plainly, FLOPs unknown
        out, flops = run(inputs), None
    nonzero = sum(int((x != 0).sum().item()) * x.element_size() for _, x in leaves(out)
                  if isinstance(x, torch.Tensor))
    return out, {"bytes_in": tensor_bytes(inputs), "bytes_out": tensor_bytes(out), "bytes_out_nonzero": nonzero,
                 "flops": flops}


def flop_rate(peaks: dict[str, float], precision: str, allow_tf32: bool) -> float | None:
    """The peak rate a precision's FLOPs may run at: fp32 at the tensor-core TF32 rate only when TF32 is allowed."""
    if precision == "fp32" and allow_tf32:
        return peaks.get("tf32", peaks.get("fp32"))
    return peaks.get(precision)


def bounds(work: dict[str, Any], peaks: dict[str, float], allow_tf32: bool) -> dict[str, float | None]:
    """Lower bounds in microseconds: `full` (everything read and written, all FLOPs), `outputs` (non-zero outputs
    written), `flops` (FLOPs at the permitted precisions' peaks; None when unknown)."""
    bandwidth = peaks["bytes"]
    flops_us = None
    if work.get("flops") is not None:
        times = [n / rate for p, n in work["flops"].items() if n and (rate := flop_rate(peaks, p, allow_tf32))]
        flops_us = sum(times) * 1e6
    memory_us = (work["bytes_in"] + work["bytes_out"]) / bandwidth * 1e6
    return {"full": max(memory_us, flops_us or 0.0), "outputs": work["bytes_out_nonzero"] / bandwidth * 1e6,
            "flops": flops_us}


def hard_problem(t: float, bound: dict[str, float | None], error_ratio: float | None,
                 precision_warn_ratio: float) -> str | None:
    """Why a time is impossible for an honest candidate at the permitted precision, or None."""
    if t * OUTPUT_MARGIN < bound["outputs"]:
        return (f"faster than the speed of light: {t:.1f} us, but writing the outputs alone takes "
                f"{bound['outputs']:.1f} us at this device's peak bandwidth; the measurement is being gamed")
    if bound["flops"] and t < bound["flops"] and error_ratio is not None and error_ratio > precision_warn_ratio:
        return (f"precision: {t:.1f} us is faster than the permitted precision's peak allows ({bound['flops']:.1f} us "
                f"for these FLOPs), and the error against fp64 is {error_ratio:.0f}x fp32 eager's: the candidate "
                "computes in a lower precision than allowed (TF32/fp16/bf16)")
    return None
