"""The inputs of the candidate's calls: drawn by the trusted side, written into shared memory the candidate maps.

The trusted side (reference worker) owns one memfd per input layout (the tensors' dtypes and shapes, values passed
as such) and writes each call's inputs into it while the candidate is stopped; the candidate's process maps it once
and calls `forward` on tensors that are views of it. It never runs the task's `get_inputs` and never sees a seed.
After each call the trusted side compares the memory with what it wrote: an input changed in place is seen there.
Flat inputs only (tensors and plain values), as KernelBench's tasks have them.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import torch

NAME = "cuda-agent-inputs"  # how the candidate's mappings of these buffers read in /proc/PID/maps
ALIGN = 64


class InputError(ValueError):
    """Inputs this path cannot carry (nested structures, non-CPU tensors); str() says which."""


def layout_of(inputs: list) -> list[dict[str, Any]]:
    """Where each input lies in the buffer (tensors, packed contiguously and aligned) or its value."""
    items, offset = [], 0
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                raise InputError(f"input {i} is on {x.device}: the trusted input path carries CPU tensors")
            nbytes = x.numel() * x.element_size()
            items.append({"kind": "tensor", "dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape),
                          "offset": offset, "nbytes": nbytes})
            offset += -(-nbytes // ALIGN) * ALIGN
        elif x is None or isinstance(x, (bool, int, float, str)):
            items.append({"kind": "value", "value": x})
        else:
            raise InputError(f"input {i} is a {type(x).__name__}: only tensors and plain values are carried")
    return items


def layout_bytes(layout: list[dict[str, Any]]) -> int:
    return max([item["offset"] + -(-item["nbytes"] // ALIGN) * ALIGN for item in layout if item["kind"] == "tensor"],
               default=0)


def _views(buffer: mmap.mmap | None, layout: list[dict[str, Any]]) -> list:
    views = []
    for item in layout:
        if item["kind"] == "value":
            views.append(item["value"])
            continue
        dtype = getattr(torch, item["dtype"])
        count = item["nbytes"] // torch.empty((), dtype=dtype).element_size()
        flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=item["offset"]) if count else \
            torch.empty(0, dtype=dtype)
        views.append(flat.view(item["shape"]))
    return views


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.detach().contiguous().reshape(-1).view(torch.uint8)


class InputBuffer:
    """The trusted side's buffer for one layout: `write` a call's inputs, then see what `changed` in the call."""

    def __init__(self, layout: list[dict[str, Any]]):
        self.layout = layout
        self.nbytes = max(layout_bytes(layout), 1)
        self.fd = os.memfd_create(NAME, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.nbytes)
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
        self.map.close()
        os.close(self.fd)


def map_inputs(fd: int, layout: list[dict[str, Any]]) -> list:
    """The candidate's side: its inputs as views of the trusted side's buffer (the descriptor is closed here)."""
    nbytes = layout_bytes(layout)
    try:
        buffer = mmap.mmap(fd, max(nbytes, 1)) if nbytes else None
    finally:
        os.close(fd)
    return _views(buffer, layout)
