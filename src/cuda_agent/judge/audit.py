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


class ThreadAudit:
    """Ops that other threads run while a trial is in progress.

    The dispatch mode above is thread-local, so a candidate could hand the work to a background thread. Here the
    profiler records CPU ops on every thread (`profile_all_threads`); ops on the harness's own thread are the
    harness's (input generation, output export) or already audited, ops on any other thread are the candidate's.
    """

    MARKER = "cuda_agent_harness_thread"

    def __init__(self, allowed: tuple[str, ...], enabled: bool = True):
        self.allowed = frozenset(allowed)
        self.violations: dict[str, int] = {}
        self.available = True
        self.enabled = enabled
        self._prof = None
        self._marker = None

    def __enter__(self) -> "ThreadAudit":
        from torch._C._profiler import _ExperimentalConfig
        from torch.profiler import ProfilerActivity, profile, record_function

        if not self.enabled:  # a policy that allows torch ops (kernelbench)
            return self
        try:
            config = _ExperimentalConfig(profile_all_threads=True)
        except TypeError:  # torch too old to profile other threads
            self.available = False
            return self
        self._prof = profile(activities=[ProfilerActivity.CPU], experimental_config=config)
        self._prof.__enter__()
        self._marker = record_function(self.MARKER)
        self._marker.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._prof is None:
            return
        self._marker.__exit__(*exc)
        self._prof.__exit__(*exc)
        events = self._prof.events()
        harness = {e.thread for e in events if e.name == self.MARKER}
        for e in events:
            if e.thread not in harness and e.name.startswith("aten::") and e.name[6:] not in self.allowed:
                self.violations[e.name] = self.violations.get(e.name, 0) + 1

    def messages(self) -> list[str]:
        return [f"torch op {op} ran {n}x in a background thread during the trial (compute must happen in the "
                "candidate's kernels)" for op, n in sorted(self.violations.items())]
