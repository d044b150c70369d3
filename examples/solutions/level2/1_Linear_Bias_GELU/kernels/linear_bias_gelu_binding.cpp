#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "../binding_registry.h"

extern "C" void linear_bias_gelu_launcher(float* out, const float* x, const float* w, const float* bias,
                                          int64_t batch, int64_t in, int64_t outs);

static torch::Tensor linear_bias_gelu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.dtype() == torch::kFloat32,
                "x must be a contiguous 2-D float32 tensor");
    TORCH_CHECK(weight.is_contiguous() && weight.size(1) == x.size(1) && bias.numel() == weight.size(0),
                "weight must be [out, in] and contiguous, bias [out]");
    auto out = torch::empty({x.size(0), weight.size(0)}, x.options());
    linear_bias_gelu_launcher(out.data_ptr<float>(), x.data_ptr<float>(), weight.data_ptr<float>(),
                              bias.data_ptr<float>(), x.size(0), x.size(1), weight.size(0));
    return out;
}

static void register_linear_bias_gelu(pybind11::module& m) {
    m.def("linear_bias_gelu_forward", &linear_bias_gelu_forward, py::arg("x"), py::arg("weight"), py::arg("bias"));
}

REGISTER_BINDING(linear_bias_gelu, register_linear_bias_gelu);
