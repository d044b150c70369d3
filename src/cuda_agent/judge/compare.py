"""Output comparison, done in the judge's process on CPU in float64 (never inside the candidate's process)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .tensors import leaves, structure


@dataclass
class Comparison:
    ok: bool = True
    reason: str | None = None
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0  # normwise: ||cand - ref|| / ||ref||, worst output
    errors_vs_fp64: list[float] = field(default_factory=list)  # same measure against the fp64 reference

    def fail(self, reason: str) -> "Comparison":
        if self.ok:
            self.ok, self.reason = False, reason
        return self


def relative_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    diff = torch.linalg.vector_norm((a.double() - ref.double()).flatten())
    norm = torch.linalg.vector_norm(ref.double().flatten())
    return float(diff / norm) if norm > 0 else float(diff)


def compare(cand: Any, ref: Any, ref64: Any | None, atol: float, rtol: float, result: Comparison,
            label: str) -> Comparison:
    """Check one trial's outputs against the fp32 reference; accumulate error statistics into `result`."""
    cand_leaves, ref_leaves = list(leaves(cand)), list(leaves(ref))
    if [p for p, _ in cand_leaves] != [p for p, _ in ref_leaves]:
        return result.fail(f"{label}: output structure {structure(cand)} != expected {structure(ref)}")
    ref64_leaves = dict(leaves(ref64)) if ref64 is not None else {}
    for (path, c), (_, r) in zip(cand_leaves, ref_leaves):
        where = f"{label}: {path}"
        if isinstance(r, torch.Tensor):
            if not isinstance(c, torch.Tensor):
                return result.fail(f"{where} is {type(c).__name__}, expected a tensor")
            if c.shape != r.shape:
                return result.fail(f"{where} has shape {list(c.shape)}, expected {list(r.shape)}")
            if c.dtype != r.dtype:
                return result.fail(f"{where} has dtype {c.dtype}, expected {r.dtype}")
            if not (c.is_floating_point() or c.is_complex()):
                if not torch.equal(c, r):
                    return result.fail(f"{where}: {int((c != r).sum())} of {r.numel()} elements differ")
                continue
            if not bool(torch.isfinite(c).all()):
                bad = int((~torch.isfinite(c)).sum())
                return result.fail(f"{where}: {bad} of {c.numel()} elements are NaN or Inf")
            if c.numel() == 0:
                continue
            diff = (c.double() - r.double()).abs()
            result.max_abs_error = max(result.max_abs_error, float(diff.max()))
            result.max_rel_error = max(result.max_rel_error, relative_error(c, r))
            r64 = ref64_leaves.get(path)
            if isinstance(r64, torch.Tensor) and r64.shape == c.shape:
                result.errors_vs_fp64.append(relative_error(c, r64))
            bound = atol + rtol * r.double().abs()
            over = diff > bound
            if bool(over.any()):
                idx = int(torch.argmax((diff - bound).flatten()))
                return result.fail(
                    f"{where}: {int(over.sum())} of {c.numel()} elements outside atol={atol:g}, rtol={rtol:g} "
                    f"(worst at flat index {idx}: got {float(c.flatten()[idx]):.6g}, expected "
                    f"{float(r.flatten()[idx]):.6g}; max abs error {float(diff.max()):.3g})")
        else:
            if isinstance(r, (int, float)) and isinstance(c, (int, float)) and not isinstance(r, bool):
                if not math.isfinite(c) or abs(c - r) > atol + rtol * abs(r):
                    return result.fail(f"{where} = {c!r}, expected {r!r}")
            elif c != r:
                return result.fail(f"{where} = {c!r}, expected {r!r}")
    return result


def inputs_unchanged(before: Any, after: Any) -> str | None:
    """None if the candidate left its inputs exactly as given, else the first difference."""
    for (path, b), (_, a) in zip(leaves(before, "input"), leaves(after, "input")):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype \
                    or not torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)):
                return f"{path} was modified in place by ModelNew.forward"
    return None
