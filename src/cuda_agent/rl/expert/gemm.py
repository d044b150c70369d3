"""The GEMM family's matrix product, appended to its epilogue's kernel file: y = x @ w.T for nn.Linear's weight w
[n, k]. CUDA: cuBLAS's SGEMM on torch's handle (its stream is the current one; TF32 as torch's settings leave it).
cpu: one dot product of two contiguous rows per output, over OpenMP threads, `omp simd` inside."""

from __future__ import annotations

CPU = """
// y [rows, n] = x [rows, k] @ w [n, k].T
extern "C" void {name}_gemm(float* y, const float* x, const float* w, int64_t rows, int64_t n, int64_t k) {{
{pragma}    for (int64_t r = 0; r < rows; ++r) {{
        for (int64_t j = 0; j < n; ++j) {{
            const float* xr = x + r * k;
            const float* wj = w + j * k;
            float acc = 0.f;
{simd}            for (int64_t i = 0; i < k; ++i) acc += xr[i] * wj[i];
            y[r * n + j] = acc;
        }}
    }}
}}
"""

CUDA = """
#include <cublas_v2.h>

// y [rows, n] = x [rows, k] @ w [n, k].T: in cuBLAS's column-major terms y.T [n, rows] = w [n, k] @ x.T [k, rows]
extern "C" void {name}_gemm(float* y, const float* x, const float* w, int64_t rows, int64_t n, int64_t k,
                            cublasHandle_t handle) {{
    const float one = 1.f, zero = 0.f;
    cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)rows, (int)k, &one, w, (int)k, x, (int)k, &zero, y,
                (int)n);
}}
"""


def source(cuda: bool, knobs, name: str) -> str:
    if cuda:
        return CUDA.format(name=name)
    return CPU.format(name=name, pragma="#pragma omp parallel for collapse(2) schedule(static)\n" if knobs.parallel
                      else "", simd="#pragma omp simd reduction(+:acc)\n" if knobs.simd else "")
