// D: each thread walks its own contiguous chunk of 64 elements, so a warp's loads are 256 bytes apart (uncoalesced).
#include <cuda_runtime.h>
#include <cstdint>

constexpr int64_t CHUNK = 64;

__global__ void affine_relu_kernel(float* __restrict__ out, const float* __restrict__ x, float scale, float shift,
                                   int64_t n) {
    const int64_t begin = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * CHUNK;
    const int64_t end = begin + CHUNK < n ? begin + CHUNK : n;
    for (int64_t i = begin; i < end; ++i) out[i] = fmaxf(x[i] * scale + shift, 0.f) * 0.5f;
}

extern "C" void affine_relu_launcher(float* out, const float* x, float scale, float shift, int64_t n, int threads,
                                     cudaStream_t stream) {
    const int64_t blocks = ((n + CHUNK - 1) / CHUNK + threads - 1) / threads;
    if (blocks > 0) affine_relu_kernel<<<(unsigned)blocks, threads, 0, stream>>>(out, x, scale, shift, n);
}
