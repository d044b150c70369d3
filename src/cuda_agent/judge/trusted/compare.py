"""Output comparison, run by the trusted reference worker on its device, in chunks (never in the candidate's
process). Each trial's result carries the tolerance verdict, the error statistics and, against an fp64
reference, the candidate's error beside fp32 eager's own, so a precision downgrade is visible.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .. import kernelbench
from ..wire.tensors import leaves, structure
from ..wire.transfer import import_tensor

CHUNK = 1 << 25  # elements per comparison step: bounds the float64 temporaries


def _norm_ratio(sq_diff: float, sq_ref: float) -> float:
    return math.sqrt(sq_diff / sq_ref) if sq_ref > 0 else math.sqrt(sq_diff)


def compare_tensor(c: torch.Tensor, r: torch.Tensor, r64: torch.Tensor | None, atol: float, rtol: float,
                   where: str, max_rel: float = 0.5) -> dict[str, Any]:
    """Elementwise |c - r| <= atol + rtol*|r| over every element; where r holds an infinity c must hold the same one,
    and NaN or Inf in c pass only there (a NaN in r is the task's problem, said as such); complex outputs compare
    their real and imaginary parts. Scale-aware too: where the outputs are so small that `atol` alone would pass
    zeros or a constant, the normwise relative error ||c - r|| / ||r|| must stay under `max_rel` (0.5: far beyond
    rounding, far below "not computed")."""
    res: dict[str, Any] = {"ok": True, "reason": None, "max_abs": 0.0, "rel": 0.0, "rel64": None, "eager_rel64": None}
    if c.shape != r.shape:
        return {**res, "ok": False, "reason": f"{where} has shape {list(c.shape)}, expected {list(r.shape)}"}
    if c.dtype != r.dtype:
        return {**res, "ok": False, "reason": f"{where} has dtype {c.dtype}, expected {r.dtype}"}
    if c.is_complex():  # `.double()` would keep the real parts only
        c, r = torch.view_as_real(c.resolve_conj()), torch.view_as_real(r.resolve_conj())
        r64 = torch.view_as_real(r64.resolve_conj()) if r64 is not None and r64.is_complex() else None
    cf, rf = c.reshape(-1), r.reshape(-1)
    if not c.is_floating_point():
        diff = int((cf != rf).sum())
        return res if diff == 0 else {**res, "ok": False, "reason": f"{where}: {diff} of {r.numel()} elements differ"}
    r64f = r64.reshape(-1) if r64 is not None and r64.shape == r.shape else None
    sq = {"diff": 0.0, "ref": 0.0, "diff64": 0.0, "eager64": 0.0, "ref64": 0.0}
    for start in range(0, cf.numel(), CHUNK):
        cc, rr = cf[start:start + CHUNK].double(), rf[start:start + CHUNK].double()
        same = None  # where both hold the reference's own infinity (left out of every error sum below)
        if bool(torch.isnan(rr).any()):
            return {**res, "ok": False, "reason": f"{where}: the reference's own output has "
                                                  f"{int(torch.isnan(rr).sum())}+ NaN elements on these inputs: "
                                                  "a problem of the task, not of the candidate"}
        if not (bool(torch.isfinite(cc).all()) and bool(torch.isfinite(rr).all())):
            same = torch.isinf(rr) & (cc == rr)  # the reference's own infinity, in the same place: equal
            bad = ~same & ~(torch.isfinite(cc) & torch.isfinite(rr))  # any other NaN or Inf, on either side
            if bool(bad.any()):
                first = int(torch.nonzero(bad)[0])
                return {**res, "ok": False, "reason": (
                    f"{where}: {int(bad.sum())} elements are NaN or Inf where the reference's are not, or finite "
                    f"where the reference's are infinite (in the first {start + cc.numel()} of {cf.numel()}; first "
                    f"at flat index {start + first}: got {float(cc[first]):.6g}, expected {float(rr[first]):.6g})")}
            cc, rr = torch.where(same, 0.0, cc), torch.where(same, 0.0, rr)
        diff = (cc - rr).abs()
        excess = diff - (atol + rtol * rr.abs())
        worst = int(torch.argmax(excess))
        res["max_abs"] = max(res["max_abs"], float(diff.max()))
        sq["diff"] += float((diff * diff).sum())
        sq["ref"] += float((rr * rr).sum())
        if not float(excess[worst]) <= 0:  # (a NaN, which no check here should let through, fails too)
            over = int((~(excess <= 0)).sum())
            return {**res, "ok": False, "reason": (
                f"{where}: {over}+ of {cf.numel()} elements outside atol={atol:g}, rtol={rtol:g} (worst at flat "
                f"index {start + worst}: got {float(cc[worst]):.6g}, expected {float(rr[worst]):.6g})")}
        if r64f is not None:
            r6 = r64f[start:start + CHUNK].double()
            if same is not None:  # (inf - inf: every error against fp64 read NaN, and the precision rule, which
                r6 = torch.where(same, 0.0, r6)  # takes their max, passed anything: red team 2026-12-06)
            sq["diff64"] += float(((cc - r6) ** 2).sum())
            sq["eager64"] += float(((rr - r6) ** 2).sum())
            sq["ref64"] += float((r6 * r6).sum())
    res["rel"] = _norm_ratio(sq["diff"], sq["ref"])
    if sq["ref"] > 0 and res["rel"] > max_rel:
        return {**res, "ok": False, "reason": (
            f"{where}: relative error {res['rel']:.3g} (||out - ref|| / ||ref||) although every element is within "
            f"atol={atol:g}: the output does not follow the reference, whose values are tiny")}
    if r64f is not None:
        res["rel64"] = _norm_ratio(sq["diff64"], sq["ref64"])
        res["eager_rel64"] = _norm_ratio(sq["eager64"], sq["ref64"])
    return res


def unfit(out: Any, out64: Callable[[], Any]) -> str | None:
    """Why the reference's outputs on some inputs cannot be the answer a candidate is held to (None: they can): a
    NaN, or an infinity its float64 run (`out64()`, called only then; None where it has none) does not share: fp32
    overflow, where a candidate summing in another order may differ without being wrong. An infinity the float64
    run has too (a masked score, the log of 0) is part of the answer."""
    wide = None
    for path, x in leaves(out):
        if not isinstance(x, torch.Tensor) or not (x.is_floating_point() or x.is_complex()):
            continue
        x = torch.view_as_real(x.resolve_conj()) if x.is_complex() else x
        if bool(torch.isfinite(x).all()):
            continue
        if bool(torch.isnan(x).any()):
            return "not finite (NaN)"
        wide = out64() if wide is None else wide
        x64 = dict(leaves(wide)).get(path) if wide is not None else None
        if isinstance(x64, torch.Tensor) and x64.is_complex():
            x64 = torch.view_as_real(x64.resolve_conj())
        if not isinstance(x64, torch.Tensor) or x64.shape != x.shape:
            return "not finite (infinities, and no float64 run to tell them from overflow)"
        if not bool((~torch.isinf(x) | (x64 == x)).all()):
            return "not finite (infinite where the float64 run is finite: an overflow)"
    return None


def _same_value(value: Any, r: Any, atol: float, rtol: float) -> bool:
    """A plain Python output: a float within the tolerance (or the same infinity), anything else (ints, bools,
    strings) equal and of the same type; exact, as integer tensors are."""
    if isinstance(r, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(r) or not math.isfinite(value):
            return value == r
        return abs(value - r) <= atol + rtol * abs(r)
    return type(value) is type(r) and value == r


Leaf = tuple[str, str, Callable[[], Any]]  # (path, "tensor" or "value" or what else it is, its loader)


def compare_leaves(got: list[Leaf], got_structure: str, ref: Any, ref64: Any | None, atol: float, rtol: float,
                   label: str, max_rel: float = 0.5, kernelbench_rule: bool = False) -> dict[str, Any]:
    """Compare the candidate's output leaves, each loaded only when its turn comes (a tensor's loader may raise:
    an unreadable output), with the reference outputs of one call. With `kernelbench_rule` KernelBench's rule
    (`kernelbench.compare`) decides `ok` and `reason`, every leaf is compared, and `strict` holds what this judge's
    own rule found (None: nothing)."""
    out: dict[str, Any] = {"ok": True, "reason": None, "max_abs": 0.0, "rel": 0.0, "rel64": [], "eager_rel64": [],
                           "strict": None}
    ref_leaves = list(leaves(ref))
    if [path for path, _, _ in got] != [p for p, _ in ref_leaves]:
        reason = f"{label}: output structure {got_structure} != expected {structure(ref)}"
        return {**out, "ok": False, "reason": reason, "strict": reason if kernelbench_rule else None}
    ref64_leaves = dict(leaves(ref64)) if ref64 is not None else {}
    strict: str | None = None  # this judge's first failure
    ours: str | None = None  # KernelBench's first
    for (path, kind, load), (_, r) in zip(got, ref_leaves):
        where = f"{label}: {path}"
        if isinstance(r, torch.Tensor):
            if kind != "tensor":
                what = type(load()).__name__ if kind == "value" else kind
                reason = f"{where} is a {what}, expected a tensor"
                strict, ours = strict or reason, ours or reason
                break
            try:
                c = load()
            except (OSError, ValueError, RuntimeError, TypeError, KeyError) as exc:
                reason = f"{where}: unreadable output ({exc})"
                strict, ours = strict or reason, ours or reason
                break
            res = compare_tensor(c, r, ref64_leaves.get(path), atol, rtol, where, max_rel)
            if kernelbench_rule and ours is None:
                found = kernelbench.compare(r, c, atol, rtol)
                ours = f"{where}: {found}" if found else None
            del c
            out["max_abs"] = max(out["max_abs"], res["max_abs"])
            out["rel"] = max(out["rel"], res["rel"])
            if res["rel64"] is not None:
                out["rel64"].append(res["rel64"])
                out["eager_rel64"].append(res["eager_rel64"])
            if not res["ok"]:
                strict = strict or res["reason"]
        else:
            value = load() if kind == "value" else kind
            if not _same_value(value, r, atol, rtol):
                strict = strict or f"{where} = {value!r}, expected {r!r}"
            if kernelbench_rule and ours is None:
                found = kernelbench.compare(r, value, atol, rtol)
                ours = f"{where}: {found}" if found else None
        if strict and not kernelbench_rule:
            break
    if not kernelbench_rule:
        return {**out, "ok": strict is None, "reason": strict}
    return {**out, "ok": ours is None, "reason": ours, "strict": strict}


def compare_trial(manifest: Any, fds: list[int], ref: Any, ref64: Any | None, atol: float, rtol: float, device: str,
                  label: str, max_rel: float = 0.5) -> dict[str, Any]:
    """Compare the candidate's outputs (its manifest and the descriptors of their shared memory, `transfer.py`) with
    the reference outputs of one trial."""
    got = manifest.get("leaves") if isinstance(manifest, dict) else None
    if not isinstance(got, list) or not all(isinstance(item, dict) for item in got):
        return {"ok": False, "reason": f"{label}: malformed output manifest", "max_abs": 0.0, "rel": 0.0,
                "rel64": [], "eager_rel64": []}
    items: list[Leaf] = [
        (item.get("path"), "value", lambda item=item: item.get("value")) if item.get("kind") == "value" else
        (item.get("path"), "tensor", lambda item=item: import_tensor(item, fds, device)) for item in got]
    return compare_leaves(items, str(manifest.get("structure")), ref, ref64, atol, rtol, label, max_rel)
