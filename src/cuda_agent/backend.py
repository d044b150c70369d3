"""Execution backends: one object owns the compiler, its flags, the device and the timing method.

`cuda` is the product. `cpu` runs the very same pipeline with C++/OpenMP kernels so that everything can be
tested on machines without a GPU. Nothing outside this module asks which backend it is talking to.

This module is imported both by the judge (to build) and by its worker processes (to place tensors, flush
caches and time); torch is imported lazily so the judge's own process never initialises a GPU.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

EXTENSION_NAME = "cuda_extension"


class BackendError(RuntimeError):
    """The backend cannot work on this machine (no GPU, no compiler...)."""


@functools.lru_cache(maxsize=None)
def _tool_version(tool: str) -> str:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"cannot run {tool}: {exc}") from exc
    return " ".join(out.stdout.split()) or tool  # all of it: g++ names its version first, nvcc last


@functools.lru_cache(maxsize=None)
def _torch_build_info() -> dict[str, Any]:
    import torch
    from torch.utils import cpp_extension

    defines = ["-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME={EXTENSION_NAME}"]
    # pybind11 ABI tags must match torch's own, or tensors cannot cross the module boundary.
    for getter in ("_get_pybind11_abi_build_flags", "_get_glibcxx_abi_build_flags"):
        fn = getattr(cpp_extension, getter, None)
        if fn is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                defines += list(fn())
    if not any("GLIBCXX_USE_CXX11_ABI" in d for d in defines):
        defines.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    return {
        "version": torch.__version__,
        "includes": list(cpp_extension.include_paths()),
        "lib_dir": str(Path(torch.__file__).parent / "lib"),
        "defines": defines,
    }


@dataclass
class Backend:
    """Base class; see `CudaBackend` and `CpuBackend`."""

    name: str = "base"
    device: str = "cpu"
    kernel_suffix: str = ".cpp"
    timing_method: str = ""
    # Whether timing sees which kernels ran (GPU): then timed calls need no op audit, whose overhead would show.
    kernel_timeline: bool = False
    # Whether the device is not the CPU: then torch.compile's compilation (CPU work) may run beside a timed run.
    compiles_beside_timing: bool = False
    # Whether the trusted side (the reference worker) draws the inputs, runs the clock and reads the outputs of every
    # candidate call (judge/trusted/trusted_calls.py); else the candidate's worker does (`CudaBackend.use_clock`).
    trusted_clock: bool = False
    # Device memory each of an evaluation's processes holds before it allocates anything (its CUDA context), which the
    # judge's memory budget charges beside what the task needs.
    process_memory: int = 0
    cxx: str = field(default_factory=lambda: os.environ.get("CXX", "g++"))

    # ---- building (judge process) -------------------------------------------------------------
    def check_toolchain(self) -> None:
        if shutil.which(self.cxx) is None:
            raise BackendError(f"C++ compiler '{self.cxx}' not found on PATH")

    def include_flags(self) -> list[str]:
        info = _torch_build_info()
        incs = info["includes"] + [sysconfig.get_paths()["include"]]
        return [f for inc in incs for f in ("-isystem", inc)]

    def binding_flags(self) -> list[str]:
        """Flags for the torch-facing binding files (and the precompiled header they share)."""
        return ["-O1", "-std=c++20", "-fPIC", *_torch_build_info()["defines"], *self.include_flags()]

    def pch_header(self) -> str:
        return "#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n"

    def kernel_command(self, src: str, obj: str) -> list[str]:
        raise NotImplementedError

    def link_command(self, objs: list[str], out: str, libraries: list[str]) -> list[str]:
        lib_dir = _torch_build_info()["lib_dir"]
        libs = ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
        return [self.cxx, "-shared", *objs, "-o", out, f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", *libs,
                *libraries]

    def extra_libraries(self, sources_text: str) -> list[str]:
        """Link flags for the few libraries the policy allows, when the sources use them."""
        return []

    def worker_env(self) -> dict[str, str]:
        """Environment for the worker processes (e.g. what `load_inline` builds for)."""
        return {}

    def identity(self) -> str:
        """Everything that changes object code: part of every build-cache key."""
        return "|".join([self.name, _tool_version(self.cxx), _torch_build_info()["version"], sys.version])

    def machine(self) -> str:
        """What a measurement depends on beyond the build (`identity`): the devices, their driver and runtime. Read
        without touching the device (the judge's own process never initialises CUDA)."""
        raise NotImplementedError

    def device_name(self, index: int | None) -> str:
        """The name `describe_device` gives device `index` (None: the default), read as `machine` is."""
        raise NotImplementedError

    # ---- running (worker processes) ----------------------------------------------------------
    def describe_device(self) -> str:
        raise NotImplementedError

    def synchronize(self) -> None:
        pass

    def warm_up(self) -> None:
        """Create the device's context and start its timer in this process, before either is needed (spare
        workers and reference workers do it as they start)."""

    def memory_held(self) -> int:
        """Bytes this process holds of the memory the device computes from (host RAM for the CPU)."""
        return os.sysconf("SC_PAGE_SIZE") * int(Path("/proc/self/statm").read_text().split()[1])

    def memory_peak(self) -> int:
        """The most bytes of that memory this process has held."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def memory_total(self) -> int:
        """Bytes of that memory the device has."""
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def make_cache_flusher(self) -> Callable[[], None]:
        raise NotImplementedError

    def measure(self, fn: Callable[[], Any], iters: int, prepare: Callable[[int], None],
                after: Callable[[int, float], None]) -> dict[str, Any]:
        """Time `iters` calls of fn, each after `prepare(i)` and followed by `after(i, host_us)`, both outside the
        timed region; returns per-iteration `device_us` and `host_us` lists."""
        raise NotImplementedError

    def peak_rates(self, device: str) -> dict[str, float] | None:
        """Rates no implementation can beat on this device: memory bytes/s ("bytes") and FLOP/s per precision
        ("fp64", "fp32" without tensor cores, "tf32", "bf16", "fp16", "int8"); None when unknown."""
        return None

    def precision_flags(self, allow_tf32: bool) -> dict[str, Any]:
        """Apply identical precision settings in every process; return them for the verdict."""
        import torch

        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32
        torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
        return {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        }


@dataclass
class CpuBackend(Backend):
    """C++/OpenMP kernels in `kernels/NAME.cpp`; host wall-clock timing; inductor-on-CPU as compile baseline."""

    name: str = "cpu"
    device: str = "cpu"
    kernel_suffix: str = ".cpp"
    timing_method: str = ("the trusted side's wall clock per call, from resuming the candidate's stopped processes "
                          "to stopping them again (handshake included); cache flushed before each call; baselines "
                          "timed in the reference worker while the candidate is stopped")
    trusted_clock: bool = True

    def kernel_command(self, src: str, obj: str) -> list[str]:
        # -march=native is the CPU's "-arch=sm_90": without it gcc leaves even simple loops scalar.
        return [self.cxx, "-O3", "-march=native", "-std=c++20", "-fPIC", "-fopenmp", *self.include_flags(),
                "-c", src, "-o", obj]

    def identity(self) -> str:
        return f"{super().identity()}|{_cpu_signature()}"

    def binding_flags(self) -> list[str]:
        return [*super().binding_flags(), "-fopenmp"]

    def link_command(self, objs: list[str], out: str, libraries: list[str]) -> list[str]:
        return [*super().link_command(objs, out, libraries), "-fopenmp"]

    def describe_device(self) -> str:
        return f"cpu:{_cpu_model()} x{os.cpu_count()}"

    def machine(self) -> str:
        return self.describe_device()

    def device_name(self, index: int | None) -> str:
        return self.describe_device()

    def peak_rates(self, device: str) -> dict[str, float] | None:
        # Generous bounds from the CPU's features (no real core beats them): every core at 6 GHz, two FMA units per
        # core at the widest vector width it has, 64 bytes per cycle per core from memory, AMX tiles where present.
        flags = set(_cpu_flags())
        lanes = 16 if "avx512f" in flags else 8 if {"avx", "avx2"} & flags else 4  # fp32 lanes per vector
        cycles = 6e9 * (os.cpu_count() or 1)
        fp32 = cycles * 2 * 2 * lanes
        low = cycles * 2048 if {"amx_bf16", "amx_fp16"} & flags else fp32 * 4
        return {"bytes": cycles * 64, "fp64": fp32 / 2, "fp32": fp32, "tf32": low, "bf16": low, "fp16": low,
                "int8": low * 2}

    def make_cache_flusher(self) -> Callable[[], None]:
        import ctypes

        size = min(2 * _last_level_cache_bytes() or FLUSH_MAX_BYTES, FLUSH_MAX_BYTES)
        buf = ctypes.create_string_buffer(size)  # memset on this thread: no worker thread wakes up for it
        return lambda: ctypes.memset(buf, 1, size)

    def measure(self, fn, iters, prepare, after):
        import time

        host = []
        for i in range(iters):
            prepare(i)
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e6)
            after(i, host[-1])
        return {"device_us": list(host), "host_us": host}


GPU_CLOCKS = {
    "trusted": ("the trusted side's CUDA events around each call, ordered with the candidate's stream through flags in "
                "shared GPU memory; inputs written and L2 flushed before each; the clock's constant overhead, measured "
                "on empty calls, subtracted"),
    "in-process": ("per-iteration span of all GPU activity on every stream (torch profiler / CUPTI in the candidate's "
                   "process), L2 flushed between iterations, device-wide sync per iteration"),
}


@dataclass
class CudaBackend(Backend):
    """CUDA kernels in `kernels/NAME.cu` built by nvcc for the detected arch; device time from the profiler."""

    name: str = "cuda"
    device: str = "cuda"
    kernel_suffix: str = ".cu"
    timing_method: str = ""
    trusted_clock: bool = True
    compiles_beside_timing: bool = True
    process_memory: int = 640 << 20  # (idle workers on the H100, torch 2.11: 532-656 MiB each in nvidia-smi)
    nvcc: str = ""
    arch: str = ""

    def __post_init__(self) -> None:
        self.nvcc = self.nvcc or _find_nvcc()
        clock = os.environ.get("CUDA_AGENT_GPU_CLOCK", "trusted")
        if clock not in GPU_CLOCKS:
            raise BackendError(f"CUDA_AGENT_GPU_CLOCK={clock!r}: expected one of {', '.join(GPU_CLOCKS)}")
        self.use_clock(clock == "trusted")

    def use_clock(self, trusted: bool) -> None:
        """The trusted clock (the default: judge/trusted/gpu_calls.py), or the candidate's own in-process one (CUPTI
        in its worker, which a candidate that rewrites its process can fool: `CUDA_AGENT_GPU_CLOCK=in-process`, kept
        to measure the one against the other, benchmarks/gpu_clock_agreement.py)."""
        self.trusted_clock, self.kernel_timeline = trusted, not trusted
        self.timing_method = GPU_CLOCKS["trusted" if trusted else "in-process"]

    @property
    def cuda_home(self) -> Path:
        return Path(self.nvcc).resolve().parent.parent

    def check_toolchain(self) -> None:
        super().check_toolchain()
        if not self.nvcc or not Path(self.nvcc).exists():
            raise BackendError("nvcc not found: set CUDA_HOME or put nvcc on PATH")
        if not self.arch:
            self.arch = detect_cuda_arch()

    def include_flags(self) -> list[str]:
        return [*super().include_flags(), "-isystem", str(self.cuda_home / "include")]

    def pch_header(self) -> str:
        return super().pch_header() + "#include <cuda_runtime.h>\n#include <c10/cuda/CUDAStream.h>\n"

    def kernel_command(self, src: str, obj: str) -> list[str]:
        arch = self.arch or detect_cuda_arch()
        return [self.nvcc, "-c", src, "-o", obj, "-O3", "--use_fast_math", "-std=c++20",
                f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xcompiler", "-fPIC",
                *self.include_flags()]

    def link_command(self, objs, out, libraries):
        lib64 = self.cuda_home / "lib64"
        return [*super().link_command(objs, out, libraries), "-lc10_cuda", "-ltorch_cuda", f"-L{lib64}",
                f"-Wl,-rpath,{lib64}", "-lcudart"]

    def extra_libraries(self, sources_text: str) -> list[str]:
        libs = []
        if "cublas" in sources_text:
            libs += ["-lcublas", "-lcublasLt"]
        if "cudnn" in sources_text:
            libs += ["-lcudnn"]
        return libs

    def identity(self) -> str:
        return "|".join([super().identity(), _tool_version(self.nvcc), self.arch or detect_cuda_arch()])

    def worker_env(self) -> dict[str, str]:
        return {"TORCH_CUDA_ARCH_LIST": torch_arch_list(self.arch or detect_cuda_arch())}  # this GPU only

    def describe_device(self) -> str:
        import torch

        return torch.cuda.get_device_name()

    def machine(self) -> str:
        import torch

        return f"cuda {torch.version.cuda}|{_gpus()}"

    def device_name(self, index: int | None) -> str:
        visible = [int(i) for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.strip().isdigit()]
        physical = visible[index or 0] if (index or 0) < len(visible) else index or 0
        rows = _gpus().split(";")
        return rows[physical].split(",")[0].strip() if physical < len(rows) else f"GPU {physical}"

    def peak_rates(self, device: str) -> dict[str, float] | None:
        # Datasheet peaks (boost clock, dense; fp64 on tensor cores): generous, so that a bound is a true bound.
        hopper = {"fp64": 67e12, "fp32": 67e12, "tf32": 495e12, "bf16": 989e12, "fp16": 989e12, "int8": 1979e12}
        for name, rates in (("H200", {"bytes": 4.8e12, **hopper}), ("H100", {"bytes": 3.35e12, **hopper}),
                            ("A100", {"bytes": 2.04e12, "fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12,
                                      "bf16": 312e12, "fp16": 312e12, "int8": 624e12})):
            if name in device:
                return rates
        return None

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def warm_up(self) -> None:
        import torch

        from .gpu_timing import start_profiler

        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        start_profiler()  # CUPTI's first start takes seconds: not inside a timed run holding the device

    def memory_held(self) -> int:
        import torch

        return torch.cuda.memory_reserved()

    def memory_peak(self) -> int:
        import torch

        return torch.cuda.max_memory_reserved()

    def memory_total(self) -> int:
        import torch

        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory

    def make_cache_flusher(self) -> Callable[[], None]:
        import torch

        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 * 2**20
        buf = torch.empty(max(2 * l2, 128 * 2**20), dtype=torch.uint8, device="cuda")
        reset = _persisting_l2_reset()

        def flush() -> None:
            reset()  # persisting L2 lines (access policy windows) would survive the fill below
            buf.fill_(1)

        return flush

    def measure(self, fn, iters, prepare, after):
        from .gpu_timing import measure_with_profiler

        return measure_with_profiler(fn, iters, prepare, after)


CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE, CUDA_ERROR_UNSUPPORTED_LIMIT = 0x06, 7


def _persisting_l2_reset() -> Callable[[], None]:
    """A function that returns persisting L2 lines to normal and sets the persisting set-aside to zero, through
    the CUDA runtime this process already loaded (torch's)."""
    import ctypes

    maps = Path("/proc/self/maps").read_text().split()
    path = next((p for p in maps if "/libcudart.so" in p), None)
    if path is None:
        raise BackendError("libcudart is not loaded in this process: cannot reset persisting L2 lines")
    cudart = ctypes.CDLL(path)

    def reset() -> None:
        for rc, what in ((cudart.cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache"),
                         (cudart.cudaDeviceSetLimit(CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE, ctypes.c_size_t(0)),
                          "cudaDeviceSetLimit(persisting L2, 0)")):
            if rc not in (0, CUDA_ERROR_UNSUPPORTED_LIMIT):  # GPUs before Ampere have no persisting L2
                raise RuntimeError(f"{what} failed with CUDA error {rc}")

    return reset


# the CPU flush before each call: twice the last-level cache, at most this. A server's whole L3 (480 MiB on the 2-core
# CI VM's host: 960 MiB written, 133 ms before each call, the test suite's evaluations twice as slow) is shared with
# its other tenants, not this process's to flush; 64 MiB (9 ms there) evicts the core's own caches and a call's data
# from much of it, for the candidate and the baselines alike
FLUSH_MAX_BYTES = 64 * 2**20


def _last_level_cache_bytes() -> int:
    """Size of the largest CPU cache (sysfs), 0 when unknown."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


def _cpu_model() -> str:
    import platform

    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> tuple[str, ...]:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    line = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
    return tuple(line.split(":", 1)[1].split()) if ":" in line else ()


@functools.lru_cache(maxsize=None)
def _cpu_signature() -> str:
    """Model and feature flags of this CPU: objects built with -march=native are only valid here."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))][:2]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _find_nvcc() -> str:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc") or ""


@functools.lru_cache(maxsize=None)
def detect_cuda_arch() -> str:
    """The target arch as nvcc spells it ('90a' on Hopper); CUDA_AGENT_ARCH overrides (e.g. to cross-build)."""
    forced = os.environ.get("CUDA_AGENT_ARCH")
    if forced:
        return forced.removeprefix("sm_")
    cap = ""
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip():
            cap = out.stdout.strip().splitlines()[0].strip()
    if not cap:
        raise BackendError("no CUDA GPU found (nvidia-smi reports none); use --backend cpu")
    major, minor = cap.split(".")
    arch = f"{major}{minor}"
    return arch + "a" if arch == "90" else arch  # sm_90a unlocks wgmma/setmaxnreg on Hopper


@functools.lru_cache(maxsize=None)
def _gpus() -> str:
    """Each GPU of the machine with its driver (nvidia-smi's name, driver_version and bus id, one per line)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"cannot run nvidia-smi: {exc}") from exc
    if out.returncode != 0 or not out.stdout.strip():
        raise BackendError("no CUDA GPU found (nvidia-smi reports none); use --backend cpu")
    return ";".join(line.strip() for line in out.stdout.strip().splitlines())


def torch_arch_list(arch: str) -> str:
    """nvcc's arch spelling ('90a', '100') as TORCH_CUDA_ARCH_LIST wants it ('9.0a', '10.0')."""
    digits = arch.rstrip("abcdefghijklmnopqrstuvwxyz")
    return f"{digits[:-1]}.{digits[-1]}{arch[len(digits):]}"


def get_backend(name: str) -> Backend:
    backends: dict[str, Callable[[], Backend]] = {"cuda": CudaBackend, "cpu": CpuBackend}
    if name not in backends:
        raise BackendError(f"unknown backend '{name}' (choose from: {', '.join(backends)})")
    return backends[name]()
