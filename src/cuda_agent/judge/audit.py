"""Run-time audit: every op that reaches torch's dispatcher while `ModelNew.forward` runs.

A `TorchDispatchMode` sits at the dispatcher, so it sees ops called from Python, from `torch.nn` modules and
from C++ (`torch::matmul` inside a binding alike). Allocation, views, metadata and initialising fills are
allowed; any other op means torch, not the candidate's kernel, did the computing.
"""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class OpAudit(TorchDispatchMode):
    def __init__(self, allowed: tuple[str, ...]):
        super().__init__()
        self.allowed = frozenset(allowed)
        self.violations: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args: tuple = (), kwargs: dict[str, Any] | None = None):
        name = func.overloadpacket.__name__
        if name not in self.allowed:
            key = f"aten::{name}"
            self.violations[key] = self.violations.get(key, 0) + 1
        return func(*args, **(kwargs or {}))

    def messages(self) -> list[str]:
        return [f"torch op {op} ran {n}x during ModelNew.forward (compute must happen in the candidate's kernels)"
                for op, n in sorted(self.violations.items())]
