#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "../binding_registry.h"

extern "C" void affine_relu_launcher(float* out, const float* x, float scale, float shift, int64_t n, int threads);

static torch::Tensor affine_relu_forward(torch::Tensor x, double scale, double shift, int threads) {
    TORCH_CHECK(x.is_contiguous() && x.dtype() == torch::kFloat32, "x must be contiguous float32");
    auto out = torch::empty_like(x);
    affine_relu_launcher(out.data_ptr<float>(), x.data_ptr<float>(), static_cast<float>(scale),
                         static_cast<float>(shift), x.numel(), threads);
    return out;
}

static void register_affine_relu(pybind11::module& m) {
    m.def("affine_relu_forward", &affine_relu_forward, py::arg("x"), py::arg("scale"), py::arg("shift"),
          py::arg("threads") = 256);
}

REGISTER_BINDING(affine_relu, register_affine_relu);
