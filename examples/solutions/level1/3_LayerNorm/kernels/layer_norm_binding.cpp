#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "../binding_registry.h"

extern "C" void layer_norm_launcher(float* out, const float* x, const float* weight, const float* bias, float eps,
                                    int64_t rows, int64_t cols);

static torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_contiguous() && x.dtype() == torch::kFloat32, "x must be contiguous float32");
    const int64_t cols = weight.numel();
    TORCH_CHECK(x.size(-1) == cols && bias.numel() == cols, "the last dimension of x must match weight and bias");
    auto out = torch::empty_like(x);
    layer_norm_launcher(out.data_ptr<float>(), x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                        static_cast<float>(eps), x.numel() / cols, cols);
    return out;
}

static void register_layer_norm(pybind11::module& m) {
    m.def("layer_norm_forward", &layer_norm_forward, py::arg("x"), py::arg("weight"), py::arg("bias"),
          py::arg("eps"));
}

REGISTER_BINDING(layer_norm, register_layer_norm);
