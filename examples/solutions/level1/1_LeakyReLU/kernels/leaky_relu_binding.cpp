#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "../binding_registry.h"

extern "C" void leaky_relu_launcher(float* out, const float* x, float slope, int64_t n);

static torch::Tensor leaky_relu_forward(torch::Tensor x, double slope) {
    TORCH_CHECK(x.is_contiguous() && x.dtype() == torch::kFloat32, "x must be contiguous float32");
    auto out = torch::empty_like(x);
    leaky_relu_launcher(out.data_ptr<float>(), x.data_ptr<float>(), static_cast<float>(slope), x.numel());
    return out;
}

static void register_leaky_relu(pybind11::module& m) {
    m.def("leaky_relu_forward", &leaky_relu_forward, py::arg("x"), py::arg("slope"));
}

REGISTER_BINDING(leaky_relu, register_leaky_relu);
