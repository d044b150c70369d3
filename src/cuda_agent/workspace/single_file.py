"""A workspace candidate rewritten as one KernelBench-style file that builds its kernels with `load_inline`.

The kernels and bindings are embedded as strings; the judge's `binding.cpp` and `binding_registry.h` are inlined
(the module is named by `TORCH_EXTENSION_NAME`, so any extension name works); `import cuda_extension` in
`model_new.py` becomes the `load_inline` call. C++ translation units end up in one file, so two bindings that
define `static` helpers of the same name would clash: rename one if that happens.
"""

from __future__ import annotations

import re

from .build import TEMPLATE_DIR
from .candidate import Candidate

INCLUDE_REGISTRY = re.compile(r'^\s*#\s*include\s*"(\.\./)?binding_registry\.h"\s*$', re.MULTILINE)
IMPORT_EXTENSION = re.compile(r"^import cuda_extension\b.*$", re.MULTILINE)
FLAGS = {
    "cuda": 'extra_cflags=["-O3"], extra_cuda_cflags=["-O3", "--use_fast_math"]',
    "cpu": 'extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"]',
}


class ExportError(ValueError):
    """The workspace cannot be written as a single file."""


def to_single_file(candidate: Candidate, backend: str) -> str:
    if candidate.kind != "workspace":
        raise ExportError("only a workspace candidate can be exported")
    text = candidate.text()
    model = text.get("model_new.py")
    if model is None or not IMPORT_EXTENSION.search(model):
        raise ExportError("model_new.py must contain the line `import cuda_extension`")
    registry = (TEMPLATE_DIR / "binding_registry.h").read_text()
    module = (TEMPLATE_DIR / "binding.cpp").read_text().replace("PYBIND11_MODULE(cuda_extension,",
                                                               "PYBIND11_MODULE(TORCH_EXTENSION_NAME,")
    kernels = {rel: src for rel, src in sorted(text.items()) if rel.startswith("kernels/")}
    cuda = [src for rel, src in kernels.items() if rel.endswith((".cu", ".cuh"))] if backend == "cuda" else []
    cpp = [src for rel, src in kernels.items() if rel.endswith((".cpp", ".cc"))]
    if any(rel.endswith((".h", ".hpp", ".inl")) for rel in kernels):
        raise ExportError("kernels/ has header files: inline them into the sources to export a single file")
    cpp_source = INCLUDE_REGISTRY.sub("", "\n\n".join([registry, *cpp, module]))
    cuda_source = "\n\n".join(cuda)
    build = (f"from torch.utils.cpp_extension import load_inline\n\n"
             f"CPP_SOURCE = {cpp_source!r}\n\nCUDA_SOURCE = {cuda_source!r}\n\n"
             f"cuda_extension = load_inline(\n    name=\"cuda_extension\", cpp_sources=[CPP_SOURCE],\n"
             f"    cuda_sources=[CUDA_SOURCE] if CUDA_SOURCE else [], {FLAGS[backend]},\n)")
    header = f"# Exported by cuda-agent from a workspace ({backend} backend): kernels built with load_inline.\n"
    return header + IMPORT_EXTENSION.sub(lambda _: build, model, count=1)
