"""Native code the candidate links to: torch compute reached without the dispatcher, and libraries outside the rules.

A binding can declare one of ATen's per-backend compute functions itself (`at::native::...`, `at::cpu::...`),
spelled through macros the source scan cannot read, and call it directly: the dispatcher (and so the op audit)
never sees the call. The linker cannot be fooled that way: the function is an undefined symbol of the library, by
its true name. `library_problems` reads a shared library's undefined dynamic symbols (ELF, demangled) and names
those outside the rules (strict policy):
- torch functions that compute without the dispatcher: `at::native::`, `at::cpu::`, `at::cuda::` (its stream,
  device and handle getters aside), `at::composite*::`;
- torch ops called through the dispatcher (`at::_ops::NAME::call`, what every C++ tensor method and `torch::` function
  compiles to) other than the op audit's allowed ones (allocation, views, metadata, fills), and ops looked up by name
  (`c10::Dispatcher::findSchema...`): the op audit sees them at run time too, but its report comes from the
  candidate's process, which can blank it (held out, red team 2026-12-05);
- other libraries' compute: BLAS/LAPACK/MKL/oneDNN, cuFFT, cuRAND, cuSPARSE, cuSOLVER, cuTENSOR, NCCL; cuBLAS other
  than GEMM, cuDNN other than convolution;
- run-time symbol lookup (`dlopen`, `dlsym`): what it finds cannot be checked.

The judge checks every library it builds; the candidate's worker checks every other library that gets loaded into
its process and every symbol looked up through ctypes (`NativeAudit`). Still open: code that finds a function's
address by reading a library's file itself, or that writes machine code; see docs/threat-model.md.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import struct
import sys
from pathlib import Path

from ..config import DEFAULT_ALLOWED_OPS

_FORBIDDEN_NAMESPACES = ("at::native::", "at::cpu::", "at::cuda::", "at::compositeexplicitautograd::",
                         "at::compositeimplicitautograd::", "at::compositeexplicitautogradnonfunctional::",
                         "at::mps::", "at::xpu::")
_CUDA_UTILITIES = re.compile(r"at::cuda::(getCurrentCUDAStream|getDefaultCUDAStream|getStreamFromPool|"
                             r"getCurrentDeviceProperties|getDeviceProperties|getCurrentCUDABlasHandle|"
                             r"getCurrentCUDABlasLtHandle|getCUDABlasLtWorkspace\w*|getChosenWorkspaceSize|"
                             r"warp_size|getNumGPUs|is_available|device_count|current_device|set_device|"
                             r"CUDAStream|OptionalCUDAGuard|CUDAGuard|detail::)")
_LIBRARY = re.compile(r"(cblas_|mkl_|MKL_|dnnl_|cufft|curand|cusparse|cusolver|cutensor|nccl|nvshmem|magma_)\w*")
_FORTRAN_BLAS = re.compile(r"[sdcz](gemm|gemv|symm|syrk|trsm|trmm|axpy|dot|scal|ger|getrf|getrs|potrf|gesv)_")
_CUBLAS = re.compile(r"cublas\w+")
_CUDNN = re.compile(r"cudnn\w+")
_CUBLAS_OK = re.compile(r"cublas(Lt)?(\w*[Gg]emm\w*|LtMatmul\w*|LtMatrixLayout\w*|Create\w*|Destroy\w*|SetStream\w*|"
                        r"GetStream\w*|SetMathMode|GetMathMode|SetWorkspace\w*|SetPointerMode\w*|GetPointerMode\w*|"
                        r"GetStatusString|GetStatusName|GetVersion\w*|LtGetVersion)")
_CUDNN_OK = re.compile(r"cudnn(\w*(Convolution|Filter|TensorDescriptor|Tensor4dDescriptor|TensorNdDescriptor)\w*|"
                       r"Create|Destroy|SetStream|GetStream|GetErrorString|GetVersion|GetCudartVersion)")
_RUNTIME_LOOKUP = ("dlopen", "dlsym", "dlvsym", "dlmopen")
_OPS_CALL = re.compile(r"at::_ops::(\w+)::(call|redispatch)\(")
_OP_LOOKUP = re.compile(r"c10::Dispatcher::(findSchema|findSchemaOrThrow|findOp)\(")


@functools.lru_cache(maxsize=8)
def allowed_op_structs(allowed: tuple[str, ...]) -> frozenset[str]:
    """The `at::_ops::` names of every overload of the allowed ops (`empty_memory_format`, `fill__Scalar`, ...)."""
    import torch

    found = set()
    for name in allowed:
        try:
            overloads = getattr(torch.ops.aten, name).overloads()
        except (AttributeError, RuntimeError):  # (not an aten op: a method the audit names, like `size`)
            continue
        found.update(name if overload == "default" else f"{name}_{overload}" for overload in overloads)
    return frozenset(found)


def symbol_problem(name: str, allowed_ops: tuple[str, ...] = DEFAULT_ALLOWED_OPS) -> str | None:
    """Why one (demangled) symbol is outside the strict rules, or None."""
    if (op := _OPS_CALL.match(name)) and op.group(1) not in allowed_op_structs(tuple(allowed_ops)):
        return f"'at::_ops::{op.group(1)}' is torch compute called from native code (only allocation, views and " \
               "fills are allowed there)"
    if _OP_LOOKUP.match(name):
        return f"'{name[:120]}' looks a torch op up by name, where the judge cannot check which"
    if name.startswith(_FORBIDDEN_NAMESPACES) and not _CUDA_UTILITIES.match(name):
        return f"'{name[:120]}' is torch compute called without the dispatcher"
    if _LIBRARY.fullmatch(name) or _FORTRAN_BLAS.fullmatch(name):
        return f"'{name}' belongs to a library the rules do not allow"
    if _CUBLAS.fullmatch(name) and not _CUBLAS_OK.fullmatch(name):
        return f"'{name}' is cuBLAS but not a GEMM (cuBLAS is allowed for GEMM only)"
    if _CUDNN.fullmatch(name) and not _CUDNN_OK.fullmatch(name):
        return f"'{name}' is cuDNN but not a convolution (cuDNN is allowed for convolutions only)"
    if name in _RUNTIME_LOOKUP:
        return f"'{name}' looks code up at run time, where the judge cannot check what it calls"
    return None


class UnreadableSymbols(ValueError):
    """An ELF64 file whose dynamic symbol table does not hold together (held out, red team 2026-12-05: a crafted
    library raised ValueError in the judge's process, or looped for days over 60,000 overlapping tables)."""


def dynamic_symbols(path: str | Path) -> tuple[list[str], list[tuple[str, int, int]]]:
    """(undefined symbol names, defined functions as (name, address, size)) of an ELF64 little-endian shared
    object's dynamic symbol table; empty for anything else; UnreadableSymbols for a malformed one. The file is
    mapped, not read whole (a library may be large), and only its first SHT_DYNSYM section is read."""
    import mmap

    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < 64:
                return [], []
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return [], []
    try:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return [], []
        try:
            return _read_dynsym(data)
        except (struct.error, IndexError, ValueError) as exc:
            raise UnreadableSymbols(f"malformed dynamic symbol table: {exc}") from None
    finally:
        data.close()


def _read_dynsym(data) -> tuple[list[str], list[tuple[str, int, int]]]:
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shentsize != 64 or shoff + shnum * 64 > len(data):
        raise ValueError("section headers out of the file")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * 64) for i in range(shnum)]
    undefined, defined = [], []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        if entsize != 24 or size % 24 or offset + size > len(data) or link >= shnum:
            raise ValueError("bad SHT_DYNSYM section")
        strtab_offset, strtab_size = sections[link][4], sections[link][5]
        if strtab_offset + strtab_size > len(data):
            raise ValueError("string table out of the file")
        for pos in range(offset, offset + size, 24):
            st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", data, pos)
            if not st_name:
                continue
            if st_name >= strtab_size:
                raise ValueError("symbol name out of its string table")
            end = data.find(b"\0", strtab_offset + st_name, strtab_offset + strtab_size)
            if end < 0:
                raise ValueError("unterminated symbol name")
            name = data[strtab_offset + st_name:end].decode(errors="replace")
            if st_shndx == 0:
                undefined.append(name)
            elif st_info & 0xF == 2:  # STT_FUNC
                defined.append((name, st_value, st_size))
        break  # an ELF file has one dynamic symbol table
    return undefined, defined


def demangle(name: str) -> str:
    """The C++ name of a mangled symbol (through libstdc++'s own demangler); C names come back unchanged."""
    if not name.startswith("_Z"):
        return name.split("@")[0]
    status = ctypes.c_int()
    raw = _CXA_DEMANGLE(name.split("@")[0].encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not raw:
        return name
    try:
        return ctypes.string_at(raw).decode(errors="replace")
    finally:
        _FREE(ctypes.c_void_p(raw))


def _load_demangler():
    lib = ctypes.CDLL("libstdc++.so.6")
    fn = lib.__cxa_demangle
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return fn, free


_CXA_DEMANGLE, _FREE = _load_demangler()


def library_problems(path: str | Path, allowed_ops: tuple[str, ...] = DEFAULT_ALLOWED_OPS) -> list[str]:
    """The strict rules' objections to a shared library's undefined symbols (one message each)."""
    found = []
    try:
        undefined = dynamic_symbols(path)[0]
    except UnreadableSymbols as exc:
        return [f"{Path(path).name}: {exc}"]
    for name in undefined:
        problem = symbol_problem(demangle(name), allowed_ops)
        if problem and problem not in found:
            found.append(problem)
    return [f"{Path(path).name} links {p}" for p in found]


class NativeAudit:
    """In the candidate's worker: libraries loaded after the harness started, and symbols looked up through ctypes
    (Python's audit hook, which cannot be removed), checked against the same rules."""

    def __init__(self, torch_lib: str, installed: list[str], writable: list[str]) -> None:
        """`installed`: folders of the Python installation and the system, read-only to the candidate; libraries
        there (imported by the task, say) are the platform's, not the candidate's, unless they lie in one of the
        `writable` folders (or the candidate's build)."""
        self.torch_lib = torch_lib.rstrip("/") + "/"
        self.installed = tuple(p.rstrip("/") + "/" for p in installed)
        self.writable = tuple(p.rstrip("/") + "/" for p in writable)
        self.regions = self._regions()
        self.seen = {path for _, _, path in self.regions}  # the harness's own libraries
        self.problems: list[str] = []
        sys.addaudithook(self._hook)

    @staticmethod
    def _regions() -> list[tuple[int, int, str]]:
        """Mapped shared objects as (start, end, path)."""
        found = []
        for line in Path("/proc/self/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
                start, end = parts[0].split("-")
                found.append((int(start, 16), int(end, 16), parts[5]))
        return found

    def _add(self, problem: str) -> None:
        if problem not in self.problems:
            self.problems.append(problem)

    def _library_at(self, address: int) -> str | None:
        for refresh in (False, True):
            if refresh:
                self.regions = self._regions()
            for start, end, path in self.regions:
                if start <= address < end:
                    return path
        return None

    def _hook(self, event: str, args: tuple) -> None:
        if not event.startswith("ctypes."):
            return
        if event in ("ctypes.dlsym", "ctypes.dlsym/handle") and len(args) == 2 and isinstance(args[1], str):
            problem = symbol_problem(demangle(args[1]))
            if problem:
                self._add(f"ctypes lookup: {problem}")
        elif event == "ctypes.call_function" and args and isinstance(args[0], int):
            library = self._library_at(args[0])  # a function pointer however it was found
            if library and library.startswith(self.torch_lib) and Path(library).name.startswith("libtorch"):
                self._add(f"ctypes call into {Path(library).name}: torch's own code, called past the dispatcher")

    def violations(self) -> list[str]:
        """Problems found so far, after checking the libraries loaded since the last call."""
        self.regions = self._regions()
        for path in dict.fromkeys(path for _, _, path in self.regions):
            if path not in self.seen:
                self.seen.add(path)
                real = os.path.realpath(path)
                if os.path.isfile(path) and (real.startswith(self.writable) or not real.startswith(self.installed)):
                    for problem in library_problems(path):
                        self._add(problem)
        return list(self.problems)
