"""The inputs of the candidate's calls: drawn by the trusted side, written into shared memory the candidate maps.

The trusted side (reference worker) owns one buffer per input layout (the tensors' dtypes, shapes and device,
values passed as such): a memfd for CPU tensors, GPU memory of CUDA's VMM API for CUDA tensors (`shared_memory.py`).
It writes each call's inputs into it (on the CPU while the candidate is stopped; on the GPU inside the call's
ordered window, `gpu_calls.py`); the candidate's process maps it once and calls `forward` on tensors that are views
of it. It never runs the task's `get_inputs` and never sees a seed. After each call the trusted side compares the
memory with what it wrote: an input changed in place is seen there. Flat inputs only (tensors and plain values),
as KernelBench's tasks have them, all tensors on one device.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Any

import torch

from .shared_memory import DeviceBuffer

NAME = "cuda-agent-inputs"  # how the candidate's mappings of these buffers read in /proc/PID/maps
ALIGN = 64


class InputError(ValueError):
    """Inputs this path cannot carry (nested structures, tensors on several devices); str() says which."""


def layout_of(inputs: list) -> list[dict[str, Any]]:
    """Where each input lies in the buffer (tensors, packed contiguously and aligned) or its value."""
    items, offset, devices = [], 0, set()
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            devices.add(x.device.type)
            if x.device.type not in ("cpu", "cuda") or len(devices) > 1:
                raise InputError(f"input {i} is on {x.device}: the trusted input path carries CPU or CUDA tensors, "
                                 "all on one device")
            nbytes = x.numel() * x.element_size()
            items.append({"kind": "tensor", "dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape),
                          "offset": offset, "nbytes": nbytes, "device": x.device.type})
            offset += -(-nbytes // ALIGN) * ALIGN
        elif x is None or isinstance(x, (bool, int, float, str)):
            items.append({"kind": "value", "value": x})
        else:
            raise InputError(f"input {i} is a {type(x).__name__}: only tensors and plain values are carried")
    return items


def layout_bytes(layout: list[dict[str, Any]]) -> int:
    return max([item["offset"] + -(-item["nbytes"] // ALIGN) * ALIGN for item in layout if item["kind"] == "tensor"],
               default=0)


def on_gpu(layout: list[dict[str, Any]]) -> bool:
    return any(item.get("device") == "cuda" for item in layout if item["kind"] == "tensor")


def _views(buffer: mmap.mmap | torch.Tensor | None, layout: list[dict[str, Any]]) -> list:
    """The inputs as views of `buffer` (host memory, or a uint8 CUDA tensor)."""
    views = []
    for item in layout:
        if item["kind"] == "value":
            views.append(item["value"])
            continue
        dtype = getattr(torch, item["dtype"])
        count = item["nbytes"] // torch.empty((), dtype=dtype).element_size()
        if not count:
            flat = torch.empty(0, dtype=dtype, device=item.get("device", "cpu"))
        elif isinstance(buffer, torch.Tensor):
            flat = buffer[item["offset"]:item["offset"] + item["nbytes"]].view(dtype)
        else:
            flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=item["offset"])
        views.append(flat.view(item["shape"]))
    return views


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.detach().contiguous().reshape(-1).view(torch.uint8)


class InputBuffer:
    """The trusted side's buffer for one layout: `write` a call's inputs, then see what `changed` in the call."""

    def __init__(self, layout: list[dict[str, Any]]):
        self.layout = layout
        self.nbytes = max(layout_bytes(layout), 1)
        self.map: mmap.mmap | None = None
        self.device: DeviceBuffer | None = None
        if on_gpu(layout):
            self.device = DeviceBuffer(self.nbytes, torch.cuda.current_device())
            self.fd = self.device.fd
            self.views = _views(self.device.tensor(), layout)
        else:
            self.fd = os.memfd_create(NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(self.fd, self.nbytes)
            # sealed at its size: a candidate that kept the descriptor and truncated it made this side's reads fault
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.map = mmap.mmap(self.fd, self.nbytes)
            self.views = _views(self.map, layout)
        self.written: list[torch.Tensor] = []

    def write(self, inputs: list) -> None:
        if layout_of(inputs) != self.layout:
            raise InputError("inputs of another layout")
        self.written = []
        for view, x in zip(self.views, inputs):
            if isinstance(view, torch.Tensor):
                view.copy_(x)
            self.written.append(x)

    def changed(self) -> list[int]:
        """Positions of the inputs whose memory no longer holds, byte for byte, what was written."""
        return [i for i, (view, x) in enumerate(zip(self.views, self.written)) if isinstance(view, torch.Tensor)
                and not torch.equal(_bytes(view), _bytes(x))]

    def close(self) -> None:
        self.views = []
        if self.map is not None:
            self.map.close()
            os.close(self.fd)
        self.device = None  # (its descriptor is closed with it)


def map_inputs(fd: int, layout: list[dict[str, Any]]) -> tuple[list, Any]:
    """The candidate's side: its inputs as views of the trusted side's buffer, and the mapping, which must be kept
    as long as they are used (the descriptor is closed here)."""
    nbytes = layout_bytes(layout)
    try:
        if on_gpu(layout):
            mapping = DeviceBuffer.open(fd, max(nbytes, 1), torch.cuda.current_device())
            return _views(mapping.tensor(), layout), mapping
        buffer = mmap.mmap(fd, max(nbytes, 1)) if nbytes else None
    finally:
        os.close(fd)
    return _views(buffer, layout), buffer
