"""The candidate's outputs read straight from its memory by the trusted side, while its processes are stopped.

The candidate's process only says where its outputs lie (address, dtype, shape, strides): a description it cannot
turn into a false result, since the bytes are read here (`process_vm_readv`) after every one of its threads has
stopped, and then compared. Whatever it computes after that moment is never seen; whatever it did not compute
before it is missing. The same descriptions, checked the same way, are read from GPU memory on the cuda backend
(`gpu_calls.py`).
"""

from __future__ import annotations

import bisect
import ctypes
import math
import os
from typing import Any, Callable

import torch

MAX_LEAVES = 4096
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16, torch.int32,
    torch.int64, torch.bool, torch.complex64, torch.complex128)}


Reader = Callable[[dict, int], torch.Tensor]  # (a tensor leaf's description, its span in bytes) -> its bytes (uint8)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.restype = ctypes.c_ssize_t
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                                   ctypes.c_ulong, ctypes.c_ulong]


class Unreadable(ValueError):
    """An output the candidate described cannot be read (a bad description, or memory it does not have)."""


def read_memory(pid: int, address: int, nbytes: int) -> torch.Tensor:
    """`nbytes` at `address` in process `pid`, as a uint8 tensor of this process."""
    out = torch.empty(nbytes, dtype=torch.uint8)
    done = 0
    while done < nbytes:
        local = _IoVec(out.data_ptr() + done, nbytes - done)
        remote = _IoVec(address + done, nbytes - done)
        got = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise Unreadable(f"{nbytes} bytes at {address:#x}: {os.strerror(err) if got < 0 else 'nothing read'}")
        done += got
    return out


def mapped_files(pid: int, name: str) -> list[tuple[int, int]]:
    """Address ranges of `pid`'s mappings of files whose name contains `name` (its own input buffers)."""
    ranges = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and name in fields[5]:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def layout(leaf: Any) -> tuple[list[int], list[int], int] | None:
    """A tensor leaf's shape, strides and address where they are well formed (None otherwise): at most 64
    dimensions, sizes and strides under 2^48, an address under 2^64."""
    if not isinstance(leaf, dict):
        return None
    shape, strides, address = leaf.get("shape"), leaf.get("strides"), leaf.get("ptr")
    if not (isinstance(shape, list) and isinstance(strides, list) and len(shape) == len(strides) <= 64
            and all(type(s) is int and 0 <= s < 2**48 for s in shape + strides) and type(address) is int
            and 0 <= address < 2**64):
        return None
    return shape, strides, address


def _leaf_tensor(leaf: dict[str, Any], limit: int, read: Reader) -> tuple[torch.Tensor, tuple[int, int]]:
    dtype = DTYPES.get(str(leaf.get("dtype")))
    if dtype is None:
        raise Unreadable(f"dtype {leaf.get('dtype')!r} is not one the judge compares")
    if layout(leaf) is None:
        raise Unreadable("malformed description (shape, strides, address)")
    shape, strides, address = layout(leaf)
    size = torch.empty((), dtype=dtype).element_size()
    count = math.prod(shape)
    if count == 0:
        return torch.empty(shape, dtype=dtype), (address, address)
    span = (sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * size
    if max(span, count * size) > limit:  # (a few bytes described as 2^40 elements by stride 0: a copy that large)
        raise Unreadable(f"holds {count * size} bytes over {span}: more than the {limit} left of what the judge reads "
                         "of a call's outputs")
    raw = read(leaf, span)
    flat = raw.view(dtype) if span % size == 0 else raw[:span - span % size].view(dtype)
    return flat.as_strided(shape, strides).clone(), (address, address + span)


def process_reader(pid: int) -> Reader:
    """Reads a leaf's bytes at its address in the stopped process `pid`."""
    return lambda leaf, span: read_memory(pid, leaf["ptr"], span)


def read_outputs(leaves: Any, limit_bytes: int, forbidden: list[tuple[int, int]],
                 read: Reader) -> list[tuple[str, Any]]:
    """The outputs a stopped candidate described, as (path, tensor or plain value) pairs whose bytes `read` gets
    (from its memory: `process_reader`; on the GPU from the blocks it shared, `gpu_calls.py`). A tensor lying in
    `forbidden` ranges (the candidate's view of its inputs) is refused: an output aliasing an input. Raises
    Unreadable with the reason."""
    if not isinstance(leaves, list) or len(leaves) > MAX_LEAVES or not all(isinstance(x, dict) for x in leaves):
        raise Unreadable("malformed output description")
    found: list[tuple[str, Any]] = []
    for leaf in leaves:
        path = str(leaf.get("path"))[:200]
        if leaf.get("kind") == "value":
            value = leaf.get("value")
            if not (value is None or isinstance(value, (bool, int, float, str))):
                raise Unreadable(f"{path}: a value of type {type(value).__name__}")
            found.append((path, value))
            continue
        if leaf.get("kind") != "tensor":
            what = str(leaf.get("type"))[:60]
            raise Unreadable(f"{path} is a {what}, not a plain torch.Tensor" if leaf.get("kind") == "subclass" else
                             f"{path} is a {what}, not a tensor or number")
        try:
            tensor, (lo, hi) = _leaf_tensor(leaf, limit_bytes, read)
        except Unreadable as exc:
            raise Unreadable(f"{path}: {exc}") from None
        limit_bytes -= tensor.numel() * tensor.element_size()  # the limit holds for all of a call's outputs
        if hi > lo and any(lo < b and a < hi for a, b in forbidden):
            raise Unreadable(f"{path} aliases an input tensor's memory")
        found.append((path, tensor))
    return found


def overlaps_itself(shape: list[int], strides: list[int]) -> bool:
    """Whether a layout may reach one element by two indices (a stride-0 `expand`; interleaved strides): read, it
    is copied out whole by the judge, which writes what the candidate never did (an exotic layout that does not
    overlap but interleaves its strides counts too)."""
    reach = 0
    for stride, size in sorted((st, n) for n, st in zip(shape, strides) if n > 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def tensor_spans(leaves: Any) -> list[tuple[str, int, int]]:
    """(path, first byte, end) of each tensor a call described (malformed ones left out: reading them fails)."""
    spans = []
    for leaf in leaves if isinstance(leaves, list) else []:
        found = layout(leaf)
        if found is None or leaf.get("kind") != "tensor" or str(leaf.get("dtype")) not in DTYPES or 0 in found[0]:
            continue
        shape, strides, address = found
        size = torch.empty((), dtype=DTYPES[str(leaf["dtype"])]).element_size()
        spans.append((str(leaf.get("path")), address, address + (sum((n - 1) * s for n, s in zip(shape, strides))
                                                                  + 1) * size))
    return spans


def aliased_pages(pid: int, spans: list[tuple[int, int]]) -> str | None:
    """Where the memory of `spans` maps one page of a file or of shared memory at two addresses (one row's pages
    mapped 256 times read as 256 rows, written once): the two mappings; None where no page is mapped twice."""
    merged: list[list[int]] = []  # the spans as sorted, disjoint ranges (a mapping is looked up in them)
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    ends = [b for _, b in merged]
    found = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            lo, _, rest = line.partition("-")
            lo, hi = int(lo, 16), int(rest[:rest.index(" ")], 16)
            i = bisect.bisect_right(ends, lo)
            if i < len(merged) and merged[i][0] < hi:
                fields = line.split(maxsplit=5)
                if int(fields[4]):
                    offset = int(fields[2], 16)
                    found.append((fields[3], int(fields[4]), offset, offset + hi - lo, fields[0]))
    found.sort()
    for (dev, inode, start, end, where), (dev2, inode2, start2, _, where2) in zip(found, found[1:]):
        if (dev, inode) == (dev2, inode2) and start2 < end:
            return f"{where} and {where2} map the same pages"
    return None


def read_scattered(pid: int, places: list[tuple[int, int]]) -> bytes | None:
    """The bytes at each (address, length) of process `pid`, joined (None where any cannot be read)."""
    out = bytearray()
    for first in range(0, len(places), 1024):  # (IOV_MAX)
        batch = places[first:first + 1024]
        total = sum(n for _, n in batch)
        buffer = ctypes.create_string_buffer(total)
        local = _IoVec(ctypes.addressof(buffer), total)
        remote = (_IoVec * len(batch))(*[_IoVec(a, n) for a, n in batch])
        if _libc.process_vm_readv(pid, ctypes.byref(local), 1, remote, len(batch), 0) != total:
            return None
        out += buffer.raw
    return bytes(out)
