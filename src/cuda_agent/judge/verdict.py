"""The verdict: what the judge concluded about one candidate. Keys are stable (documented in docs/verdict.md)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

NOISY_TIMING = "timing too noisy"  # how the warning of a correct candidate whose timing could not be trusted begins
UNCREDITED = "no speedup credited"  # (kernelbench policy) how it begins where timed calls gave wrong outputs
OUT_OF_TIME = "out of time"  # how the error begins where the caller's deadline ended the evaluation (not a finding
# about the candidate: judged again, it may pass)


@dataclass
class Verdict:
    reward: int
    compiled: bool
    correct: bool
    policy_violations: list[str] = field(default_factory=list)
    error: str | None = None  # the first failure reason
    times_us: dict[str, float | None] = field(
        default_factory=lambda: {"eager": None, "compile": None, "candidate": None})
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    max_abs_error: float | None = None
    backend: str = ""
    device: str | None = None
    torch_version: str = ""
    # Details beyond the headline keys.
    max_rel_error: float | None = None
    error_vs_fp64: dict[str, float | None] = field(
        default_factory=lambda: {"candidate": None, "eager_fp32": None, "ratio": None})
    tolerance: dict[str, float] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    sandbox: str = ""  # the isolation the candidate's process ran under
    policy: str = "strict"  # the rules it was judged by (strict: CUDA Agent's; kernelbench)
    # kernelbench: what the strict judge would also have found (none of it changes this verdict)
    strict_findings: list[str] = field(default_factory=list)
    # --timing kernelbench: KernelBench's timing, made in the candidate's own process (it decides nothing here)
    kernelbench_timing: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] = field(default_factory=dict)
    candidate: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    phases_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def reason(self) -> str:
        """Why the reward is below the top one, in one line ("" at reward 3): the failure, a timing too noisy to
        credit, or the speed that fell short."""
        if self.error:
            return self.error.splitlines()[0]
        if not self.correct:
            return "not correct"
        noisy = next((w for w in self.warnings if w.startswith((NOISY_TIMING, UNCREDITED))), None)
        if noisy or self.reward >= 3:
            return noisy or ""
        if self.speedup_vs_eager is None:
            return "correct, not timed"
        if self.reward == 2:
            return f"beats eager ({self.speedup_vs_eager:.2f}x) but not torch.compile ({self.speedup_vs_compile:.2f}x)"
        return f"correct, but does not beat eager ({self.speedup_vs_eager:.2f}x)"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reason": self.reason}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})
