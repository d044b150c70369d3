"""Outputs allocated where the trusted side can read them, on the cuda backend's trusted path.

`forward` runs under a `torch.cuda.MemPool` over `output_pool.c`'s allocator, whose blocks are GPU memory exported
as file descriptors: the trusted side maps each block once and reads the outputs where they lie, right after the
call's ordered window closes (`trusted/gpu_calls.py`). An output outside the pool (a tensor made in `__init__`, a
view of an input) is copied into it inside the call, on the call's stream: the candidate's choice, at its cost.
This runs in the candidate's process: nothing here is believed; a description or descriptor that is not what it
says fails to read.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

from ..wire.tensors import leaves

SOURCE = Path(__file__).with_name("output_pool.c")


def build(folder: Path, compiler: str = "gcc") -> Path:
    """The allocator's library in `folder`, compiled once per source (CUDA's headers and driver library)."""
    from torch.utils.cpp_extension import CUDA_HOME

    library = folder / f"output_pool-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]}.so"
    if library.is_file():
        return library
    if not CUDA_HOME:
        raise RuntimeError("the output pool needs CUDA's headers: no CUDA toolkit found (CUDA_HOME)")
    folder.mkdir(parents=True, exist_ok=True)
    partial = library.with_suffix(f".{os.getpid()}.tmp")
    stubs = Path(CUDA_HOME) / "lib64" / "stubs"
    command = [compiler, "-shared", "-fPIC", "-O2", f"-I{CUDA_HOME}/include", str(SOURCE), "-o", str(partial),
               *([f"-L{stubs}"] if stubs.is_dir() else []), "-lcuda"]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the output pool failed: {proc.stderr.strip()[-2000:]}")
    os.replace(partial, library)
    return library


class OutputPool:
    """The pool `forward` allocates from (`allocating()`), and where its outputs lie (`describe`)."""

    def __init__(self, library: str):
        self.lib = ctypes.CDLL(library)
        self.lib.ca_export.restype = ctypes.c_int
        self.lib.ca_export.argtypes = [ctypes.c_void_p] + [ctypes.POINTER(ctypes.c_uint64)] * 3
        allocator = torch.cuda.memory.CUDAPluggableAllocator(library, "ca_alloc", "ca_free")
        self.pool = torch.cuda.MemPool(allocator.allocator())
        self.shared: set[int] = set()  # serials of the blocks whose descriptors were sent

    def allocating(self):
        return torch.cuda.use_mem_pool(self.pool)

    def describe(self, out: Any) -> tuple[list[dict[str, Any]], list[int], list]:
        """Where each output leaf lies (block serial and offset for tensors), the descriptors of blocks not shared
        before (with `block_sizes` in their leaves), and the tensors to keep alive until the outputs are read.
        Called inside `allocating()` (the call's window), so a copy made here lands in the pool: entering the pool
        again would fail in torch ("beginAllocateToPool: already recording to mempool_id")."""
        found, fds, kept = [], [], []
        for path, x in leaves(out):
            if not isinstance(x, torch.Tensor):
                found.append({"path": path, "kind": "value", "value": x} if x is None or isinstance(
                    x, (bool, int, float)) else {"path": path, "kind": "object", "type": type(x).__name__})
                continue
            if type(x) is not torch.Tensor or x.device.type != "cuda":
                found.append({"path": path, "kind": "subclass" if type(x) is not torch.Tensor else "object",
                              "type": type(x).__name__ if type(x) is not torch.Tensor else f"tensor on {x.device}"})
                continue
            described = {"path": path, "kind": "tensor", "dtype": str(x.dtype).removeprefix("torch."),
                         "shape": list(x.shape), "strides": list(x.stride())}
            if x.numel() == 0:
                found.append({**described, "ptr": 0, "block": -1, "block_size": 0, "new_block": False})
                continue
            located = self._locate(x)
            if located is None:  # not allocated from the pool: copied into it (the caller's `allocating()`)
                x = x.clone()
                described["strides"] = list(x.stride())
                located = self._locate(x)
                if located is None:
                    raise RuntimeError("an output copied into the output pool is not in it")
            kept.append(x)
            serial, offset, size, fd = located
            if fd is not None:
                fds.append(fd)
            found.append({**described, "ptr": offset, "block": serial, "block_size": size,
                          "new_block": fd is not None})
        return found, fds, kept

    def _locate(self, x: torch.Tensor) -> tuple[int, int, int, int | None] | None:
        base, size, serial = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        fd = self.lib.ca_export(ctypes.c_void_p(x.data_ptr()), ctypes.byref(base), ctypes.byref(size),
                                ctypes.byref(serial))
        if fd < 0:
            return None
        if serial.value in self.shared:
            os.close(fd)
            fd = None
        else:
            self.shared.add(serial.value)
        return serial.value, x.data_ptr() - base.value, size.value, fd
