"""How a candidate's outputs cross from its process to the reference worker: shared memory, no pickles, no files.

The candidate worker copies every tensor leaf into a buffer of its own (`shared_memory`: GPU memory for CUDA
tensors, a sealed memfd for CPU ones) and describes the outputs in a JSON manifest whose leaves name their buffer
by position; the buffers' descriptors travel through the judge over the workers' sockets (SCM_RIGHTS). The
reference worker validates dtype, shape and sizes, copies each leaf out (the candidate can write to its buffers
until it is gone: the comparison reads a private copy) and closes the descriptors.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .shared_memory import DeviceBuffer, HostBuffer
from .tensors import leaves, structure


def export_outputs(obj: Any) -> tuple[dict, list[DeviceBuffer | HostBuffer]]:
    """The manifest and the filled buffers (keep them until compared; share `[b.fd for b in buffers]`)."""
    items, buffers = [], []
    for path, x in leaves(obj):
        if not isinstance(x, torch.Tensor):
            value = x if isinstance(x, (int, float, bool)) or x is None else repr(x)
            items.append({"path": path, "kind": "value", "value": value, "type": type(x).__name__})
            continue
        item = {"path": path, "kind": "cuda" if x.is_cuda else "host", "dtype": str(x.dtype).removeprefix("torch."),
                "shape": list(x.shape), "fd": None}
        flat = x.detach().contiguous().reshape(-1).view(torch.uint8)
        if flat.numel():
            buffer = DeviceBuffer(flat.numel(), x.device.index) if x.is_cuda else HostBuffer(flat.numel())
            buffer.tensor().copy_(flat)
            item["fd"] = len(buffers)
            buffers.append(buffer)
        items.append(item)
    if any(isinstance(b, DeviceBuffer) for b in buffers):
        torch.cuda.synchronize()  # the reader's process sees the copies only once they are done
    for buffer in buffers:
        if isinstance(buffer, HostBuffer):
            buffer.seal()
    return {"structure": structure(obj), "leaves": items}, buffers


def _dtype(item: dict) -> torch.dtype:
    dtype = getattr(torch, str(item.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {item.get('dtype')!r}")
    return dtype


def import_tensor(item: dict, fds: list[int], device: str) -> torch.Tensor:
    """A private copy, on `device`, of one tensor leaf of a manifest written by `export_outputs` (validated;
    raises ValueError, or RuntimeError/OSError from the driver or the kernel). The descriptors stay open."""
    dtype = _dtype(item)
    shape = [int(s) for s in item["shape"]]
    if any(s < 0 for s in shape):
        raise ValueError(f"negative size in {shape}")
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    index = item.get("fd")
    if not isinstance(index, int) or not 0 <= index < len(fds):
        raise ValueError(f"no shared memory handed over for it (buffer {index!r} of {len(fds)})")
    if item["kind"] == "cuda":
        if not device.startswith("cuda"):
            raise ValueError("a CUDA output where the reference runs on the CPU")
        ordinal = torch.device(device).index
        buffer = DeviceBuffer.open(fds[index], nbytes, torch.cuda.current_device() if ordinal is None else ordinal)
        copy = buffer.tensor().view(dtype).reshape(shape).clone()
        torch.cuda.synchronize()  # before the mapping goes
        return copy
    if item["kind"] != "host":
        raise ValueError(f"unknown leaf kind {item['kind']!r}")
    buffer = HostBuffer.open(fds[index], nbytes)
    return buffer.tensor().view(dtype).reshape(shape).to(device, copy=True)
