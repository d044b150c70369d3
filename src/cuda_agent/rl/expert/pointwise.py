"""The pointwise family's kernel: every element read once and written once, the traced chain inlined."""

from __future__ import annotations

PARAMS = "struct FusedParams {{ const float* p[{max_params}]; }};\n"

CPU = """// {ops}: one fused pass (knobs: {knobs}).
#include <cmath>
#include <cstdint>

{params}
static inline float {name}_op(float v0) {{
{body}
    return {result};
}}

extern "C" void {name}_launcher(float* out, const float* x, int64_t rows, int64_t cols, FusedParams p, int config) {{
    (void)config;
    (void)p;
    const int64_t n = rows * cols;
{pragma}    for (int64_t i = 0; i < n; ++i) {{
        out[i] = {name}_op(x[i]);
    }}
}}
"""

CUDA = """// {ops}: one fused pass (knobs: {knobs}).
#include <cuda_runtime.h>
#include <cstdint>

{params}
__device__ __forceinline__ float {name}_op(float v0) {{
{body}
    return {result};
}}

__global__ void {name}_kernel(float* __restrict__ out, const float* __restrict__ x, int64_t n, bool aligned) {{
    const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;  // one pass when the grid covers every element
{vector_loop}    for (int64_t i = {tail_start} + first; i < n; i += stride) {{
        out[i] = {name}_op(x[i]);
    }}
}}

extern "C" void {name}_launcher(float* out, const float* x, int64_t rows, int64_t cols, FusedParams p, int config,
                                cudaStream_t stream) {{
    (void)config;
    (void)p;
    const int64_t n = rows * cols;
    const int threads = {threads};
    int64_t blocks = ({units} + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
{cap}    const bool aligned = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out)) & 15) == 0;
    {name}_kernel<<<(unsigned)blocks, threads, 0, stream>>>(out, x, n, aligned);
}}
"""

VECTOR_LOOP = """    const int64_t n4 = aligned ? n / 4 : 0;  // float4 loads need 16-byte aligned pointers
    for (int64_t i = first; i < n4; i += stride) {{
        float4 v = reinterpret_cast<const float4*>(x)[i];
        v.x = {name}_op(v.x);
        v.y = {name}_op(v.y);
        v.z = {name}_op(v.z);
        v.w = {name}_op(v.w);
        reinterpret_cast<float4*>(out)[i] = v;
    }}
"""


def source(program, cuda: bool, knobs, name: str, max_params: int) -> str:
    body = "\n".join("    " + line for line in program.elements().splitlines())
    common = dict(name=name, ops=" -> ".join(program.ops), body=body, result=program.output,
                  params=PARAMS.format(max_params=max_params))
    if not cuda:
        pragma = ("#pragma omp parallel for" + (" simd" if knobs.simd else "") + " schedule(static)\n"
                  if knobs.parallel else "#pragma omp simd\n" if knobs.simd else "")
        return CPU.format(**common, pragma=pragma, knobs=f"parallel={knobs.parallel}, simd={knobs.simd}")
    vector = knobs.vector == 4
    return CUDA.format(
        **common, threads=knobs.threads, units="(n / 4 + n % 4)" if vector else "n",
        knobs=f"vector={knobs.vector}, threads={knobs.threads}, grid_stride={knobs.grid_stride}",
        vector_loop=VECTOR_LOOP.format(name=name) if vector else "", tail_start="n4 * 4" if vector else "0",
        cap="    if (blocks > 132 * 16) blocks = 132 * 16;\n" if knobs.grid_stride else "")
