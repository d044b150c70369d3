"""Run-time audit: every op that reaches torch's dispatcher while `ModelNew.forward` runs.

A `TorchDispatchMode` sits at the dispatcher, so it sees ops called from Python, from `torch.nn` modules and
from C++ (`torch::matmul` inside a binding alike). Allocation, views, metadata and initialising fills are
allowed; any other op means torch, not the candidate's kernel, did the computing.
"""

from __future__ import annotations

import sys
import threading
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


CANARY = "lerp"  # the op the trusted side's challenge asks the audited session to see a given number of times


# TorchScript's fusers run a fused group of torch ops as one kernel of their own (NNC: `fused_mul_add_relu...`, on the
# CPU or compiled with NVRTC on the GPU) that dispatches nothing but its outputs' allocation; the profiler records it
# by these names (held out, red team 2026-12-06: `torch.jit.script` warmed up in `__init__` was correct under
# strict, no violation, every element computed by NNC)
TORCHSCRIPT_FUSED = ("fused_", "prim::TensorExprGroup", "prim::FusionGroup", "prim::CudaFusionGroup")


def _torch_ops() -> frozenset[str]:
    """torch's own dispatcher ops outside `aten` (and `profiler`, record_function's): `mkldnn::`, `quantized::`,
    `prims::`..., as registered when this module is imported, before any candidate code (a candidate's own
    `TORCH_LIBRARY` ops, registered later, are not among them). None is an allocation or a view. Held out (red team
    E, 2026-12-06): `mkldnn::_linear_pointwise` in the timed calls, which the CPU sampler never watches (its
    interrupts, every 50 us, show in a 300 us spin at the start of a call, so the candidate computed itself only
    where they did): correct under strict, no violation."""
    import torch

    try:
        names = torch._C._dispatch_get_all_op_names()
    except AttributeError:  # (a torch without it: aten's rule alone)
        return frozenset()
    return frozenset(n.split(".")[0] for n in names if not n.startswith(("aten::", "profiler::")))


TORCH_OPS = _torch_ops()


class ThreadAudit:
    """Ops that any thread runs while the candidate's calls go on.

    The dispatch mode above is thread-local and sits in a stack the candidate can pop, so the profiler also records
    the CPU ops of every thread (`profile_all_threads`). With `harness_too`, every op outside the allowed ones is a
    violation, whichever thread ran it (the trusted path: the harness runs no torch op of its own in a call); else
    the thread that entered the audit is the harness's (known by its native id: a name, or a range named like the
    harness's, can be taken by any thread) and its ops were audited by the dispatch mode. `challenge(n)` runs the
    canary op n times inside the session: a session that does not see exactly n was not recording.
    """

    def __init__(self, allowed: tuple[str, ...], enabled: bool = True, harness_too: bool = False):
        self.allowed = frozenset(allowed)
        self.violations: dict[str, int] = {}
        self.available = True
        self.enabled, self.harness_too = enabled, harness_too
        self._prof = None
        self.harness = threading.get_native_id()
        self.challenged = self.seen = 0

    def __enter__(self) -> "ThreadAudit":
        from torch._C._profiler import _ExperimentalConfig
        from torch.profiler import ProfilerActivity, profile

        if not self.enabled:  # a policy that allows torch ops (kernelbench)
            return self
        try:
            config = _ExperimentalConfig(profile_all_threads=True)
        except TypeError:  # torch too old to profile other threads
            self.available = False
            return self
        self.harness = threading.get_native_id()
        self._prof = profile(activities=[ProfilerActivity.CPU], experimental_config=config)
        self._prof.__enter__()
        return self

    def challenge(self, times: int) -> None:
        import torch

        self.challenged = times
        x = torch.zeros(1)
        for _ in range(times):
            torch.lerp(x, x, 0.5)

    def __exit__(self, *exc) -> None:
        if self._prof is None:
            return
        try:
            self._prof.__exit__(*exc)
            events = self._prof.events()
        except RuntimeError:  # someone else stopped the profiler: the challenge finds nothing recorded
            events = []
        for e in events:
            if e.name.startswith(TORCHSCRIPT_FUSED):  # torch's compute, whichever thread ran it
                key = f"{e.name[:80]} (a TorchScript fusion kernel)"
                self.violations[key] = self.violations.get(key, 0) + 1
                continue
            if not e.name.startswith("aten::") and e.name in TORCH_OPS:  # torch's op of another namespace: compute
                self.violations[e.name] = self.violations.get(e.name, 0) + 1
                continue
            if not e.name.startswith("aten::") or e.name[6:] in self.allowed:
                continue
            if e.name == f"aten::{CANARY}" and e.device_resource_id == self.harness:
                self.seen += 1
            elif self.harness_too or e.device_resource_id != self.harness:
                self.violations[e.name] = self.violations.get(e.name, 0) + 1
        if self.seen > self.challenged:  # the candidate ran the canary op itself
            self.violations[f"aten::{CANARY}"] = self.seen - self.challenged

    def messages(self) -> list[str]:
        where = "in the candidate's calls" if self.harness_too else "in a background thread during the trial"
        found = [f"torch op {op} ran {n}x {where} (compute must happen in the candidate's kernels)"
                 for op, n in sorted(self.violations.items())]
        if self._prof is not None and self.seen < self.challenged:
            found.append(f"the op audit was not recording: it saw {self.seen} of the {self.challenged} checks the "
                         "judge asked for")
        return found


class Introspection:
    """Candidate code reaching for the harness's objects: the collector's object lists, other threads' frames,
    trace and profile hooks (from anywhere), and the caller's frames (`sys._getframe`, a traceback's or generator's
    frame) asked for directly from the candidate's own files. An audit hook sees them; it cannot be removed once
    added (`arm` it just before the candidate's code first runs). A second line of defence: everything that decides
    a verdict is measured outside this process."""

    EVERYWHERE = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
                  "sys.setprofile")
    FRAMES = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back")

    def __init__(self, candidate_dirs: list[str], installed: list[str] = ()):
        """`candidate_dirs`: where the candidate's code may lie; `installed`: folders inside them whose code is
        not the candidate's (packages on the import path, read-only to it)."""
        self.dirs = tuple(d.rstrip("/") + "/" for d in candidate_dirs)
        self.installed = tuple(d.rstrip("/") + "/" for d in installed)
        self.found: dict[str, int] = {}
        self.armed = False
        self._inside = threading.local()
        sys.addaudithook(self._hook)

    def arm(self) -> None:
        self.armed = True

    def _hook(self, event: str, args: tuple) -> None:
        if not self.armed or getattr(self._inside, "busy", False):
            return
        if event in self.EVERYWHERE:
            self._note(event)
        elif event == "sys._getframe" or (event == "object.__getattr__" and len(args) > 1 and args[1] in self.FRAMES):
            self._inside.busy = True
            try:
                caller = sys._getframe(1)  # the code that asked (the hook is called from C, in its frame)
                where = caller.f_code.co_filename
                if where.startswith(self.dirs) and not where.startswith(self.installed):
                    self._note(event if event == "sys._getframe" else f"{type(args[0]).__name__}.{args[1]}")
            finally:
                self._inside.busy = False

    def _note(self, what: str) -> None:
        self.found[what] = self.found.get(what, 0) + 1

    def messages(self) -> list[str]:
        return [f"introspection: {what} ({n}x): the candidate reached for the judge's objects in its process"
                for what, n in sorted(self.found.items())]
