"""How a candidate's outputs cross from its process to the reference worker, without pickles.

The candidate worker writes a JSON manifest: one entry per output leaf. A CUDA tensor is shared in place
through a CUDA IPC handle (no copy; the worker keeps the tensor alive until the judge moves on); anything else
is written as raw bytes to a file. The reference worker validates dtype, shape and sizes before it reads.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .tensors import leaves, structure


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def export_outputs(obj: Any, folder: Path, use_ipc: bool) -> dict:
    """Describe (and, for files, write) every output leaf; returns a JSON-able manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    items = []
    for i, (path, x) in enumerate(leaves(obj)):
        if not isinstance(x, torch.Tensor):
            value = x if isinstance(x, (int, float, bool)) or x is None else repr(x)
            items.append({"path": path, "kind": "value", "value": value, "type": type(x).__name__})
            continue
        item = {"path": path, "dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape)}
        if use_ipc and x.is_cuda and x.numel() > 0:
            dev, handle, size, offset, rc_handle, rc_offset, ev_handle, ev_sync = x.untyped_storage()._share_cuda_()
            item.update(kind="cuda_ipc", stride=list(x.stride()), storage_offset=x.storage_offset(),
                        ipc=[dev, _b64(handle), size, offset, _b64(rc_handle), rc_offset, _b64(ev_handle), ev_sync])
        else:
            fname = folder / f"leaf{i}.bin"
            write_bytes(x, fname)
            item.update(kind="tensor", file=str(fname))
        items.append(item)
    return {"structure": structure(obj), "leaves": items}


def _dtype(item: dict) -> torch.dtype:
    dtype = getattr(torch, str(item["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {item['dtype']!r}")
    return dtype


def import_tensor(item: dict, device: str) -> torch.Tensor:
    """Open one tensor leaf of a manifest written by `export_outputs` (validated; raises ValueError)."""
    dtype = _dtype(item)
    shape = [int(s) for s in item["shape"]]
    if item["kind"] == "cuda_ipc":
        dev, handle, size, offset, rc_handle, rc_offset, ev_handle, ev_sync = item["ipc"]
        storage = torch.UntypedStorage._new_shared_cuda(
            int(dev), base64.b64decode(handle), int(size), int(offset), base64.b64decode(rc_handle),
            int(rc_offset), base64.b64decode(ev_handle), bool(ev_sync))
        stride = [int(s) for s in item["stride"]]
        itemsize = torch.empty((), dtype=dtype).element_size()
        extent = int(item["storage_offset"]) + sum((n - 1) * s for n, s in zip(shape, stride)) + 1
        if min(stride, default=0) < 0 or extent * itemsize > storage.nbytes():
            raise ValueError(f"{item['path']}: view exceeds its shared storage")
        return torch.empty((0,), dtype=dtype, device=f"cuda:{int(dev)}").set_(
            storage, int(item["storage_offset"]), shape, stride)
    if item["kind"] != "tensor":
        raise ValueError(f"unknown leaf kind {item['kind']!r}")
    numel = int(np.prod(shape)) if shape else 1
    expected = numel * torch.empty((), dtype=dtype).element_size()
    size = os.path.getsize(item["file"])
    if size != expected:
        raise ValueError(f"{item['path']}: {size} bytes on disk, {expected} expected")
    if expected == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    raw = torch.from_file(str(item["file"]), shared=False, size=expected, dtype=torch.uint8)  # mapped, not read
    return raw.view(dtype).reshape(shape).to(device)


def write_bytes(x: torch.Tensor, path: Path) -> None:
    """The tensor's bytes into a file, copied straight from the device into a shared mapping of it."""
    flat = x.detach().contiguous().reshape(-1).view(torch.uint8)
    if flat.numel() == 0:
        path.write_bytes(b"")
        return
    with open(path, "wb") as f:
        f.truncate(flat.numel())
    torch.from_file(str(path), shared=True, size=flat.numel(), dtype=torch.uint8).copy_(flat)
