"""KernelBench single-file format: ModelNew builds its C++/OpenMP kernel with load_inline."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <algorithm>

torch::Tensor affine_relu(torch::Tensor x, double scale, double shift) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "x must be contiguous float32");
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float s = static_cast<float>(scale), b = static_cast<float>(shift);
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = std::max(in[i] * s + b, 0.f) * 0.5f;
    return out;
}
"""

ext = load_inline(name="affine_relu_inline", cpp_sources=[source], functions=["affine_relu"],
                  extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return ext.affine_relu(x, self.scale, self.shift)
