"""The candidate runs in the same process as the harness that verifies and times it, so it could replace the
harness's functions: clocks, synchronisation, the profiler, the input fingerprints, the op audit. `Integrity`
records every function and class those depend on before candidate code runs and names any that was replaced
(or whose code object was swapped) afterwards; the worker checks after loading and after every command.

Not covered: rewriting memory through ctypes or patching C code; in-process checks cannot stop that (the
judge's threat model says so). Native kernels cannot reach the Python objects checked here.
"""

from __future__ import annotations

import importlib
from types import FunctionType, ModuleType
from typing import Any

WATCHED_MODULES = (
    "builtins", "os", "time", "json", "statistics", "hashlib", "math",
    "torch", "torch._C", "torch.cuda", "torch.profiler", "torch.autograd.profiler", "torch.utils._python_dispatch",
    "cuda_agent.backend", "cuda_agent.judge.wire.timing", "cuda_agent.gpu_timing", "cuda_agent.judge.wire.tensors",
    "cuda_agent.judge.wire.transfer", "cuda_agent.judge.wire.shared_memory", "cuda_agent.judge.candidate.audit",
    "cuda_agent.judge.wire.process", "cuda_agent.judge.candidate.integrity",
    "cuda_agent.judge.checks.symbols", "cuda_agent.sandbox.seccomp", "cuda_agent.workspace.inline",
)  # plus the worker's own module, passed as `extra` (it runs as __main__)
WATCHED_CLASSES = ("Tensor", "TensorBase", "Event", "Stream", "profile")
_MISSING = object()


def _watched(owner: Any) -> bool:
    return isinstance(owner, type) and (owner.__module__ or "").startswith(("torch", "cuda_agent"))


class Integrity:
    def __init__(self, extra: tuple[ModuleType, ...] = ()):
        self.entries: list[tuple[str, dict, str, Any, Any]] = []
        self.class_keys: list[tuple[str, Any, set[str]]] = []
        seen: set[int] = set()
        for module in (*(importlib.import_module(m) for m in WATCHED_MODULES), *extra):
            self._record(module.__name__, module, seen)

    def _record(self, label: str, owner: Any, seen: set[int]) -> None:
        if id(owner) in seen:
            return
        seen.add(id(owner))
        namespace = vars(owner)
        for name, value in list(namespace.items()):
            if not callable(value) and not isinstance(value, (staticmethod, classmethod, property)):
                continue
            self.entries.append((label, namespace, name, value, getattr(value, "__code__", None)))
            if _watched(value) and (label.startswith("cuda_agent") or value.__name__ in WATCHED_CLASSES):
                self._record(f"{label}.{name}", value, seen)
        if isinstance(owner, type):  # a new attribute on a class shadows its bases' (Tensor.copy_ = ...)
            self.class_keys.append((label, namespace, set(namespace)))

    def changed(self) -> list[str]:
        """Names of the recorded functions and classes that are no longer what they were."""
        out = []
        for label, namespace, name, value, code in self.entries:
            now = namespace.get(name, _MISSING)
            if now is not value or (isinstance(now, FunctionType) and now.__code__ is not code):
                out.append(f"{label}.{name}")
        for label, namespace, keys in self.class_keys:
            out += [f"{label}.{name} (added)" for name in sorted(set(namespace) - keys)]
        return out
