"""How an evaluation verifies and times its candidate: the `CandidatePath` protocol, and what both paths share.

Two paths implement it: `trusted_path.py` (the reference worker draws every input, drives every call, keeps the
clock and reads the outputs: the cpu backend) and `in_process_path.py` (the candidate's worker runs the calls and
measures them: the cuda backend until it has a trusted clock). Both check the same input sets (the seeds, an extra
shape, scaled values) and apply the same precision rule.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Callable, Protocol

from ..task import describe_sizes, extra_shape, shape_constants
from .scoring.score import PRECISION_WARN_RATIO
from .wire.trusted_commands import FitSizes

if TYPE_CHECKING:
    from .evaluation import Evaluation

Errors = dict[str, list[float]]  # relative errors vs fp64: the candidate's and fp32 eager's, over every check


class CandidatePath(Protocol):
    def attach(self) -> bool:
        """Ready the candidate's calls; False when it cannot be judged (the verdict says why)."""

    def verify(self, deadline: float) -> bool:
        """Every input set checked; False on the first failure (the verdict says why)."""

    def time_candidate(self, deadline: float) -> Callable[[dict], dict]:
        """The timekeeper's callable for the candidate's timing (raises `TimingFailed` with the reason)."""

    def finish(self) -> None:
        """The calls are over: what the in-process audits found (raises `TimingFailed` on a violation)."""

    def close(self) -> None:
        """Whatever happened: the candidate's process left stopped or idle (idempotent)."""


class Verification:
    """The checks both paths make."""

    def __init__(self, ev: Evaluation):
        self.ev, self.cfg, self.verdict = ev, ev.cfg, ev.verdict

    def extra_shape(self) -> dict[str, int]:
        """The sizes of the extra-shape check: about half of each size of the inputs that can change, those at which
        the task itself runs; where none can, the verdict says so."""
        if not self.cfg.extra_shapes:
            return {}
        task = self.ev.task
        shapes = extra_shape(shape_constants(task.source))
        if not shapes:
            self.verdict.warnings.append("extra shape not checked: get_inputs() has no size that can change "
                                         "(module-level integers it alone uses, or literal sizes of the tensors it "
                                         "builds)")
            return {}
        fitted = self.ev.ref.ask(FitSizes(shapes), self.cfg.reference_timeout_s)
        if not fitted.shapes:
            self.verdict.warnings.append(f"extra shape not checked: the task does not run at other sizes of its "
                                         f"inputs ({describe_sizes(shapes, task.source)}: {fitted.reason})")
        return fitted.shapes

    def extra_label(self, shapes: dict[str, int]) -> str:
        return f"extra shape ({describe_sizes(shapes, self.ev.task.source)})"

    @staticmethod
    def scaled_check() -> tuple[str, int, float]:
        """The scaled-values check: 2-4x the task's inputs, where moments of its input distribution no longer
        hold (label, seed, scale)."""
        scale = 2 + 2 * secrets.randbelow(10**6) / 10**6
        return f"scaled inputs (x{scale:.3f})", secrets.randbelow(2**31), scale

    def precision(self, errors: Errors) -> bool:
        """Every check passed: correct, unless its error against fp64 is too far beyond fp32 eager's own (over every
        compared call so far: asked again after the timing, what it said before is replaced)."""
        verdict = self.verdict
        verdict.correct = True
        verdict.warnings = [w for w in verdict.warnings if not w.startswith("precision: ")]
        verdict.strict_findings = [f for f in verdict.strict_findings if not f.startswith("precision: ")]
        if errors["candidate"] and errors["eager"]:
            c, e = max(errors["candidate"]), max(errors["eager"])
            ratio = (c + 1e-12) / (e + 1e-12)
            verdict.error_vs_fp64 = {"candidate": c, "eager_fp32": e, "ratio": ratio}
            limit = self.cfg.max_error_ratio
            finding = f"error vs fp64 is {ratio:.0f}x fp32 eager's ({c:.2e} vs {e:.2e})"
            likely = ("the candidate likely computes in lower precision (TF32/fp16/bf16) or with approximate math "
                      "(fast-math exp, tanh, division)")
            if limit is not None and ratio > limit and c > 1e-6:
                reason = f"precision: {finding}, above the limit of {limit:g}x: {likely}"
                if self.cfg.policy == "kernelbench":  # not KernelBench's rule: what strict would say
                    verdict.strict_findings.append(reason)
                    return True
                verdict.correct = False
                verdict.error = reason
                return False
            if ratio > PRECISION_WARN_RATIO and c > 1e-6:
                verdict.warnings.append(f"precision: {finding}; {likely}")
        return True
