"""The expert's workspace for a traced program: one fused kernel (CUDA, or C++ with OpenMP on the cpu backend), its
binding (one text for every task, so builds of the same kernel are cached) and a `model_new.py` that owns the
task's parameters under their names and calls the kernel.

A GEMM task's kernel file also holds the GEMM (cuBLAS's SGEMM on CUDA, OpenMP dot products on the cpu) and its
binding runs it into a scratch buffer that the epilogue (the rows kernel) reads.

Knobs: pointwise: the vector width (float4 loads or one float) and a grid-stride loop or one element (vector) per
thread; rows: each row read once into registers (float4 when `vector` is 4) or streamed from memory in each pass,
the block reduction (warp shuffles or a shared-memory tree), softmax in one online pass or two, and short rows
within one warp (not one block each);
both: threads per block (cuda), OpenMP threads and SIMD (cpu). `SLOW` is what the expert's "improve" episodes start
from, `FAST` what they end with.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import gemm, pointwise, rows
from .trace import Program

NAME = "fused"
MAX_PARAMS = 4


@dataclass(frozen=True)
class Knobs:
    vector: int = 4  # cuda pointwise: elements per load (4: float4), 1
    threads: int = 256  # cuda: threads per block
    grid_stride: bool = True  # cuda pointwise: a capped grid that strides, or one thread per element (vector)
    reduce: str = "warp"  # cuda rows: "warp" shuffles or a "shared" memory tree
    online: bool = True  # rows: softmax's max and sum of exponentials in one pass
    warp_rows: bool = True  # cuda rows: rows of at most rows_registers.WARP_COLS elements one warp each (else a block)
    registers: bool = True  # cuda rows: each row read once into registers (rows_registers.py) when it fits
    parallel: bool = True  # cpu: OpenMP threads
    simd: bool = True  # cpu: `omp simd` on the loops

    def __post_init__(self):
        if self.vector not in (1, 4) or self.threads not in (64, 128, 256, 512, 1024) or \
                self.reduce not in ("warp", "shared"):
            raise ValueError(f"unsupported knobs {self}")


FAST = Knobs()
SLOW = Knobs(vector=1, threads=64, grid_stride=False, reduce="shared", online=False, warp_rows=False,
             registers=False, parallel=False, simd=False)


def random_knobs(rng: random.Random) -> Knobs:
    """A knob setting drawn uniformly (the ceiling's and the recipe's "random" rows)."""
    return Knobs(vector=rng.choice((1, 4)), threads=rng.choice((64, 128, 256, 512, 1024)),
                 grid_stride=rng.random() < 0.5, reduce=rng.choice(("warp", "shared")), online=rng.random() < 0.5,
                 parallel=rng.random() < 0.5, simd=rng.random() < 0.5, warp_rows=rng.random() < 0.5,
                 registers=rng.random() < 0.5)
BREAKABLE = "(void)config;"  # every kernel has it; the "fix" episodes plant a missing semicolon there

BINDING = """#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <vector>
{cuda_includes}#include "../binding_registry.h"

struct FusedParams {{ const float* p[{max_params}]; }};
extern "C" void {name}_launcher(float* out, const float* x, int64_t rows, int64_t cols, FusedParams p,
                                int config{stream_param});
{gemm_decl}
// reduced: 0 the output has x's shape, 1 one value per row (last dimension kept, size 1), 2 dropped
static torch::Tensor {name}_forward(torch::Tensor x, std::vector<torch::Tensor> params, int64_t reduced,
                                    int64_t config) {{
    TORCH_CHECK({device_check}x.dim() >= 1 && x.is_contiguous() && x.dtype() == torch::kFloat32,
                "x: contiguous float32");
    TORCH_CHECK(params.size() <= {max_params}, "at most {max_params} parameters");
    FusedParams p{{}};
    for (size_t i = 0; i < params.size(); ++i) {{
        TORCH_CHECK({param_check}params[i].is_contiguous() && params[i].dtype() == torch::kFloat32,
                    "parameters: contiguous float32 on x's device");
        p.p[i] = params[i].data_ptr<float>();
    }}
    const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
    auto sizes = x.sizes().vec();
{gemm_call}    if (reduced == 1) sizes.back() = 1;
    if (reduced == 2) sizes.pop_back();
    auto out = torch::empty(sizes, x.options());
    if (x.numel())
        {name}_launcher(out.data_ptr<float>(), {epilogue_in}, rows, {epilogue_cols}, p, (int)config{stream_arg});
    return out;
}}

static void register_{name}(pybind11::module& m) {{
    m.def("{name}_forward", &{name}_forward, py::arg("x"), py::arg("params"), py::arg("reduced") = 0,
          py::arg("config") = 0);
}}

REGISTER_BINDING({name}, register_{name});
"""

GEMM_DECL = """extern "C" void {name}_gemm(float* y, const float* x, const float* w, int64_t rows, int64_t n,
                            int64_t k{handle_param});
"""
# params[0] is the weight [n, k]: y = x @ w.T, then the epilogue runs on y
GEMM_CALL = """    TORCH_CHECK(params.size() >= 1 && params[0].dim() == 2 && params[0].size(1) == cols,
                "params[0]: the weight [n, k]");
    const int64_t n = params[0].size(0);
    auto y = torch::empty({{rows, n}}, x.options());
    if (x.numel()) {name}_gemm(y.data_ptr<float>(), x.data_ptr<float>(), p.p[0], rows, n, cols{handle_arg});
    sizes.back() = n;
"""

MODEL_NEW = """import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    \"\"\"{ops}, fused into one kernel.\"\"\"

    def __init__(self, *args, **kwargs):
        super().__init__()
{params}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.{name}_forward(x.contiguous(), [{args}], {reduced}, 0)
"""


def kernel_path(backend: str) -> str:
    return f"kernels/{NAME}.{'cu' if backend == 'cuda' else 'cpp'}"


def kernel_source(program: Program, backend: str, knobs: Knobs) -> str:
    family = pointwise if program.pointwise else rows
    source = family.source(program, backend == "cuda", knobs, NAME, MAX_PARAMS)
    return source + gemm.source(backend == "cuda", knobs, NAME) if program.gemm else source


def model_new(program: Program) -> str:
    """`model_new.py`: the parameters under the task's names (the judge loads the task's state dict into it)."""
    lines, made = [], set()
    for name, shape in program.params:
        parts = name.split(".")
        for depth in range(1, len(parts)):
            owner = ".".join(parts[:depth])
            if owner not in made:
                made.add(owner)
                lines.append(f"        self.{owner} = nn.Module()")
        lines.append(f"        self.{name} = nn.Parameter(torch.empty({', '.join(map(str, shape))}))")
    reduced = 0 if not program.reduced else 1 if program.keepdim else 2
    return MODEL_NEW.format(name=NAME, ops=" -> ".join(program.ops), reduced=reduced,
                            params="".join(line + "\n" for line in lines),
                            args=", ".join(f"self.{name}" for name, _ in program.params))


def workspace_files(program: Program, backend: str, knobs: Knobs) -> dict[str, str]:
    """Every file the expert writes into the workspace (paths relative to it)."""
    if len(program.params) > MAX_PARAMS:
        from .formulas import Unsupported

        raise Unsupported(f"more than {MAX_PARAMS} parameters")
    cuda, has_gemm = backend == "cuda", program.gemm
    handle = dict(handle_param=", cublasHandle_t handle" if cuda else "",
                  handle_arg=", at::cuda::getCurrentCUDABlasHandle()" if cuda else "")
    includes = "#include <cuda_runtime.h>\n#include <c10/cuda/CUDAStream.h>\n" if cuda else ""
    if cuda and has_gemm:
        includes += "#include <cublas_v2.h>\n#include <ATen/cuda/CUDAContext.h>\n"
    binding = BINDING.format(
        name=NAME, max_params=MAX_PARAMS, cuda_includes=includes,
        gemm_decl=GEMM_DECL.format(name=NAME, **handle) if has_gemm else "",
        gemm_call=GEMM_CALL.format(name=NAME, **handle) if has_gemm else "",
        epilogue_in="y.data_ptr<float>()" if has_gemm else "x.data_ptr<float>()",
        epilogue_cols="n" if has_gemm else "cols",
        stream_param=", cudaStream_t stream" if cuda else "", device_check="x.is_cuda() && " if cuda else "",
        param_check="params[i].device() == x.device() && ",
        stream_arg=", c10::cuda::getCurrentCUDAStream().stream()" if cuda else "")
    return {kernel_path(backend): kernel_source(program, backend, knobs), f"kernels/{NAME}_binding.cpp": binding,
            "model_new.py": model_new(program)}
