"""Memory one process fills and another reads, handed over as file descriptors (works across namespaces).

- `DeviceBuffer`: GPU memory from CUDA's virtual memory API (`cuMemCreate`) exported as a POSIX file descriptor.
  Legacy CUDA IPC handles do not open across the sandbox's namespaces; these do, because the descriptor itself
  crosses (SCM_RIGHTS over the worker's socket) instead of a name the other side must look up.
- `HostBuffer`: a sealed `memfd` (anonymous shared memory) for CPU tensors: the writer can no longer shrink it,
  so the reader's mapping cannot fault.

The writer creates a buffer and fills `tensor()`; the reader opens the received descriptor with `open` and copies
what it needs before closing it.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os

import torch

POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
# CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE
PINNED, ON_DEVICE, READ_WRITE = 1, 1, 3
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_driver: ctypes.CDLL | None = None


def _cu(name: str, *args) -> None:
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    rc = getattr(_driver, name)(*args)
    if rc != 0:
        text = ctypes.c_char_p()
        _driver.cuGetErrorString(rc, ctypes.byref(text))
        raise RuntimeError(f"{name} failed: CUDA error {rc} ({(text.value or b'?').decode()})")


class DeviceBuffer:
    """`nbytes` of memory on CUDA device `device`, mapped into this process; `fd` shares it (exporter only)."""

    def __init__(self, nbytes: int, device: int, fd: int | None = None):
        torch.cuda.current_stream(device)  # the runtime's primary context exists and is current on this thread
        prop = _AllocationProp(type=PINNED, requestedHandleTypes=POSIX_FD, location=_Location(ON_DEVICE, device))
        grain = ctypes.c_size_t()
        _cu("cuMemGetAllocationGranularity", ctypes.byref(grain), ctypes.byref(prop), 0)
        self.nbytes, self.device, self.fd = nbytes, device, -1
        self.size = max(1, -(-nbytes // grain.value)) * grain.value
        self.handle, self.ptr = ctypes.c_ulonglong(), ctypes.c_ulonglong()
        if fd is None:
            _cu("cuMemCreate", ctypes.byref(self.handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
                ctypes.c_ulonglong(0))
            exported = ctypes.c_int(-1)
            _cu("cuMemExportToShareableHandle", ctypes.byref(exported), self.handle, POSIX_FD, ctypes.c_ulonglong(0))
            self.fd = exported.value
        else:
            _cu("cuMemImportFromShareableHandle", ctypes.byref(self.handle), ctypes.c_void_p(fd), POSIX_FD)
        _cu("cuMemAddressReserve", ctypes.byref(self.ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
            ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
        # fails when the allocation behind an imported descriptor is smaller than `nbytes`
        _cu("cuMemMap", self.ptr, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle, ctypes.c_ulonglong(0))
        access = _AccessDesc(_Location(ON_DEVICE, device), READ_WRITE)
        _cu("cuMemSetAccess", self.ptr, ctypes.c_size_t(self.size), ctypes.byref(access), ctypes.c_size_t(1))

    @classmethod
    def open(cls, fd: int, nbytes: int, device: int) -> DeviceBuffer:
        """Map memory another process exported (the descriptor stays the caller's to close)."""
        return cls(nbytes, device, fd)

    def tensor(self) -> torch.Tensor:
        """The memory as a uint8 CUDA tensor, valid while this buffer lives (keep the buffer: the tensor does not).
        Made without numpy (which `torch.as_tensor` needs to read `__cuda_array_interface__`, and which strict
        candidates lack)."""
        device = torch.device("cuda", self.device)
        storage = torch._C._construct_storage_from_data_pointer(self.ptr.value, device, self.nbytes)
        return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (self.nbytes,), (1,))

    def __del__(self) -> None:
        if _driver is None:
            return
        if self.ptr.value:
            _driver.cuMemUnmap(self.ptr, ctypes.c_size_t(self.size))
            _driver.cuMemAddressFree(self.ptr, ctypes.c_size_t(self.size))
        if self.handle.value:
            _driver.cuMemRelease(self.handle)
        if self.fd >= 0:
            os.close(self.fd)


class HostBuffer:
    """`nbytes` of shared host memory (a memfd) mapped into this process; `seal()` it before sharing `fd`."""

    def __init__(self, nbytes: int, fd: int | None = None):
        self.nbytes, self.fd = nbytes, -1
        if fd is None:
            self.fd = fd = os.memfd_create("cuda-agent-output", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, nbytes)
        self.map = mmap.mmap(fd, nbytes) if nbytes else None

    def seal(self) -> None:
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)

    @classmethod
    def open(cls, fd: int, nbytes: int) -> HostBuffer:
        """Map memory another process sealed and shared (the descriptor stays the caller's to close)."""
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS != SEALS:
            raise ValueError("shared memory that its writer can still resize")
        if os.fstat(fd).st_size != nbytes:
            raise ValueError(f"shared memory of {os.fstat(fd).st_size} bytes, {nbytes} expected")
        return cls(nbytes, fd)

    def tensor(self) -> torch.Tensor:
        return torch.frombuffer(self.map, dtype=torch.uint8) if self.map else torch.empty(0, dtype=torch.uint8)

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
