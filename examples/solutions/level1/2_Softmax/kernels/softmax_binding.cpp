#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "../binding_registry.h"

extern "C" void softmax_launcher(float* out, const float* x, int64_t rows, int64_t cols);

static torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.dtype() == torch::kFloat32,
                "x must be a contiguous 2-D float32 tensor");
    auto out = torch::empty_like(x);
    softmax_launcher(out.data_ptr<float>(), x.data_ptr<float>(), x.size(0), x.size(1));
    return out;
}

static void register_softmax(pybind11::module& m) { m.def("softmax_forward", &softmax_forward, py::arg("x")); }

REGISTER_BINDING(softmax, register_softmax);
