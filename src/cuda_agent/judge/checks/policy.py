"""Static policy checks over the candidate's sources.

The candidate must compute in its own kernels: no torch/ATen compute calls from C++, and no libraries beyond
cuBLAS (GEMM only) and cuDNN (convolution only). Torch compute from Python, or hidden from this scan, is caught
at run time by `audit.py`; this scan gives an early, precise reason for what is visible in the text.
"""

from __future__ import annotations

import importlib.util
import os
import re

from ..config import PolicyConfig

# Python packages that compute (array libraries, their BLAS): under the strict policy the candidate's process cannot
# import them at all, since the op audit sees only torch's dispatcher (`compute_packages` hides them from its view).
# (pyarrow, pandas, PIL: held out, red team 2026-12-06: Arrow's compute kernels over the input's memory, wrapped with
# `foreign_buffer` and returned with `torch.frombuffer`, were correct under strict with no kernel of the candidate's
# and nothing the op audit sees; Pillow's ImageMath computes on float images the same way)
COMPUTE_PACKAGES = ("numpy", "scipy", "numba", "numexpr", "cupy", "jax", "jaxlib", "tensorflow", "sklearn", "mkl",
                    "tvm", "llvmlite", "pyarrow", "pandas", "polars", "duckdb", "PIL")

_CXX_CALL = re.compile(r"\b(?:torch|at)::((?:\w+::)*)(\w+)\s*(?:<[^<>;]*>)?\s*\(")
_INCLUDE = re.compile(r"#\s*include\s*[<\"]([^>\"]+)[>\"]")
_CUBLAS_CALL = re.compile(r"\b(cublas(?:Lt)?\w*)\s*\(")
_CUDNN_CALL = re.compile(r"\b(cudnn\w+)\s*\(")
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)

_ALLOWED_CXX_NAMESPACES = ("cuda::", "indexing::")  # stream/guard utilities, index helpers
_CUBLAS_SETUP = ("cublasCreate", "cublasDestroy", "cublasSetStream", "cublasGetStream", "cublasSetMathMode",
                 "cublasGetMathMode", "cublasSetWorkspace", "cublasSetPointerMode", "cublasGetPointerMode",
                 "cublasGetStatusString", "cublasGetStatusName", "cublasLtCreate", "cublasLtDestroy",
                 "cublasGetVersion", "cublasLtGetVersion")
_CUDNN_ALLOWED_WORDS = ("Convolution", "Filter", "TensorDescriptor", "Tensor4dDescriptor", "TensorNdDescriptor")
_CUDNN_SETUP = ("cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnGetStream", "cudnnGetErrorString",
                "cudnnGetVersion", "cudnnGetCudartVersion")


def scan_sources(files: dict[str, str], policy: PolicyConfig) -> list[str]:
    """Return one violation message per offending call or include (deduplicated, in file order)."""
    found: list[str] = []

    def add(msg: str) -> None:
        if msg not in found:
            found.append(msg)

    for rel, text in sorted(files.items()):
        if not rel.endswith(".py"):
            text = _COMMENTS.sub(" ", text)
        for match in _CXX_CALL.finditer(text):
            namespace, name = match.group(1), match.group(2)
            if namespace.startswith(_ALLOWED_CXX_NAMESPACES) or (not namespace and name in policy.allowed_cxx_calls):
                continue
            if name[:1].isupper() and not namespace:  # constructors of types such as torch::Tensor(...)
                continue
            add(f"{rel}:{_line(text, match.start())}: torch compute call "
                f"'{match.group(0).rstrip('(').strip()}' (kernels must compute in their own code)")
        for match in _INCLUDE.finditer(text):
            header = match.group(1)
            if any(header.startswith(prefix) for prefix in policy.forbidden_includes):
                add(f"{rel}:{_line(text, match.start())}: library not allowed: #include <{header}>")
            elif header.startswith("cublas") and not policy.allow_cublas_gemm:
                add(f"{rel}:{_line(text, match.start())}: cuBLAS is disabled by the policy")
            elif header.startswith("cudnn") and not policy.allow_cudnn_conv:
                add(f"{rel}:{_line(text, match.start())}: cuDNN is disabled by the policy")
        for match in _CUBLAS_CALL.finditer(text):
            name = match.group(1)
            if "gemm" in name.lower() or name.startswith(("cublasLtMatmul", "cublasLtMatrixLayout")) \
                    or name in _CUBLAS_SETUP:
                continue
            add(f"{rel}:{_line(text, match.start())}: cuBLAS call '{name}' is not a GEMM (cuBLAS is allowed "
                "for GEMM only)")
        for match in _CUDNN_CALL.finditer(text):
            name = match.group(1)
            if any(word in name for word in _CUDNN_ALLOWED_WORDS) or name in _CUDNN_SETUP:
                continue
            add(f"{rel}:{_line(text, match.start())}: cuDNN call '{name}' is not a convolution (cuDNN is "
                "allowed for convolutions only)")
    return found


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def compute_packages() -> list[str]:
    """The folders of the COMPUTE_PACKAGES installed here (and the libraries their wheels bundle beside them)."""
    found = []
    for name in COMPUTE_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            found.append(os.path.realpath(folder))
            bundled = os.path.join(os.path.dirname(folder), f"{name}.libs")
            if os.path.isdir(bundled):
                found.append(os.path.realpath(bundled))
    return list(dict.fromkeys(found))
