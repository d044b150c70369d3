"""KernelBench single-file format on CUDA: ModelNew builds its kernel with load_inline."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__global__ void affine_relu_kernel(float* out, const float* x, float scale, float shift, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(x[i] * scale + shift, 0.f) * 0.5f;
}

torch::Tensor affine_relu(torch::Tensor x, double scale, double shift) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    affine_relu_kernel<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        out.data_ptr<float>(), x.data_ptr<float>(), (float)scale, (float)shift, n);
    return out;
}
"""
cpp_source = "torch::Tensor affine_relu(torch::Tensor x, double scale, double shift);"

ext = load_inline(name="affine_relu_cuda_inline", cpp_sources=[cpp_source], cuda_sources=[cuda_source],
                  functions=["affine_relu"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return ext.affine_relu(x, self.scale, self.shift)
