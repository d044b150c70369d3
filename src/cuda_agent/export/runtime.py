"""An exported kernel at run time: copied into every package `cuda-agent export` writes (as `_runtime.py`), so the
package needs torch and nothing of cuda-agent.

The package holds the task (`_task.py`: the reference `Model`, whose class and parameter names the user's model
has), the verified solution (`_model_new.py`: `ModelNew`) and its prebuilt extensions (`_ext/*.so`). `Export`
imports `ModelNew` with `load_inline` answered by those prebuilt modules (nothing compiles on the user's machine),
defines one `torch.library` custom op (the kernel: the inputs, the module's weights as a tensor list and a handle
to the module's configuration) whose fake implementation is the task's own PyTorch code on the meta device (so
`torch.compile` traces through it), and a drop-in `nn.Module` subclassing the reference class: same constructor,
same parameter names, forward through the op. Forward only: the op has no autograd formula.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import operator
import sys
from pathlib import Path
from typing import Any

import torch
import torch.utils.cpp_extension as cpp_extension


def load_extension(folder: Path, name: str):
    """The prebuilt extension module `name` (its `.so` in `folder`), imported once per process."""
    if name in sys.modules:
        return sys.modules[name]
    path = next(iter(sorted(folder.glob(f"{name}*.so"))), None)
    if path is None:
        raise ImportError(f"no prebuilt extension {name!r} in {folder}")
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def import_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Export:
    def __init__(self, folder: Path, package: str, namespace: str, names: list[str], schema: str,
                 extensions: list[str], class_name: str):
        self.folder, self.names = Path(folder), list(names)
        self._get_weights = operator.attrgetter(*self.names) if self.names else None
        self.task = import_file(self.folder / "_task.py", f"{package}._task")
        real = cpp_extension.load_inline
        cpp_extension.load_inline = lambda name, *args, **kwargs: load_extension(self.folder / "_ext", name)
        try:
            for name in extensions:  # a workspace's binding, imported by name in model_new.py
                load_extension(self.folder / "_ext", name)
            self.model_new = import_file(self.folder / "_model_new.py", f"{package}._model_new").ModelNew
        finally:
            cpp_extension.load_inline = real
        self.configs: list[tuple[tuple, dict]] = []  # a handle is an index here
        self.kernels: dict[tuple[int, str], tuple] = {}  # (handle, device): ModelNew and where its weights lie
        self.meta: dict[int, torch.nn.Module] = {}  # handle: the reference on the meta device
        self.op = self._define(namespace, schema)
        self.op.register_fake(self._fake)
        self.module = self._drop_in(class_name)

    def _define(self, namespace: str, schema: str):
        """The op `namespace::forward`; where this process defined it already (the same kernel imported from
        another copy, e.g. the package and its `kernels` build), `namespace_2::forward`, and so on."""
        for n in range(1, 100):
            name = namespace if n == 1 else f"{namespace}_{n}"
            if not hasattr(getattr(torch.ops, name), "forward"):
                return torch.library.custom_op(f"{name}::forward", self._run, mutates_args=(), schema=schema)
        raise RuntimeError(f"{namespace}: defined 99 times in this process")

    def handle(self, args: tuple, kwargs: dict) -> int:
        """The handle of a module configuration (its constructor's arguments)."""
        for i, seen in enumerate(self.configs):
            try:
                if seen == (args, kwargs):
                    return i
            except RuntimeError:  # tensors among the arguments: compared by identity only
                if all(a is b for a, b in zip(seen[0], args)) and seen[1] is kwargs:
                    return i
        self.configs.append((args, kwargs))
        return len(self.configs) - 1

    def _run(self, *values: Any):
        *inputs, weights, handle = values
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
        key = (handle, str(device))
        if key not in self.kernels:
            args, kwargs = self.configs[handle]
            kernel = self.model_new(*args, **kwargs).to(device).eval()
            self.kernels[key] = kernel, [self._slot(kernel, name) for name in self.names]
        kernel, slots = self.kernels[key]
        for (table, leaf), weight in zip(slots, weights):  # ModelNew runs on the caller's weights, bound in place
            if table[leaf] is not weight:
                table[leaf] = weight
        with torch.no_grad():
            return kernel(*inputs)

    @staticmethod
    def _slot(module: torch.nn.Module, name: str) -> tuple[dict, str]:
        """Where ModelNew holds the weight `name`: its owner's parameter or buffer table, and the key there (binding
        there costs a dict lookup a call where functional_call's swap costs tens of microseconds)."""
        owner, _, leaf = name.rpartition(".")
        sub = module.get_submodule(owner)
        return (sub._parameters if leaf in sub._parameters else sub._buffers), leaf

    def _fake(self, *values: Any):
        *inputs, weights, handle = values
        if handle not in self.meta:
            args, kwargs = self.configs[handle]
            with torch.device("meta"):
                self.meta[handle] = self.task.Model(*args, **kwargs).eval()
        return torch.func.functional_call(self.meta[handle], dict(zip(self.names, weights)), tuple(inputs))

    def weights(self, module: torch.nn.Module) -> list[torch.Tensor]:
        """The module's tensors named as the task's state dict (dotted attribute paths)."""
        if self._get_weights is None:
            return []
        got = self._get_weights(module)
        return list(got) if len(self.names) > 1 else [got]

    def _drop_in(self, class_name: str) -> type:
        export, reference = self, self.task.Model

        def __init__(self, *args, **kwargs):
            reference.__init__(self, *args, **kwargs)
            self._cuda_agent_handle = export.handle(args, kwargs)

        return type(class_name, (reference,), {"__init__": __init__,
                                               "forward": self._forward("self._cuda_agent_handle"),
                                               "__doc__": f"{reference.__name__} with its forward on the exported "
                                                          "kernel (forward only)", "__module__": reference.__module__})

    def layer(self) -> type:
        """The layer class `kernels.kernelize` swaps in: forward on the kernel, for modules configured as the task's
        (its `get_init_inputs()`); `self` is the user's module, whose weights go in."""
        handle = self.handle(tuple(self.task.get_init_inputs()), {})
        return type("Layer", (torch.nn.Module,), {"forward": self._forward(f"{handle}")})

    def _forward(self, handle: str):
        """A forward with the reference's own parameters (kernelize compares signatures) that calls the op."""
        params = [p for p in inspect.signature(self.task.Model.forward).parameters.values()][1:]
        if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
            names = "*inputs"
            call = "*inputs"
        else:
            names = call = ", ".join(p.name for p in params)
        scope = {"export": self}
        exec(f"def forward(self, {names}):\n    return export.op({call}, export.weights(self), {handle})\n", scope)
        return scope["forward"]
