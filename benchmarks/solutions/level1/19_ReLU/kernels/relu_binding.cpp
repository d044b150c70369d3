#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include "../binding_registry.h"

extern "C" void relu_launcher(float* out, const float* x, int64_t n, int config, cudaStream_t stream);

static torch::Tensor relu_forward(torch::Tensor x, int config) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.dtype() == torch::kFloat32, "x: contiguous CUDA float32");
    auto out = torch::empty_like(x);
    relu_launcher(out.data_ptr<float>(), x.data_ptr<float>(), x.numel(), config,
                  c10::cuda::getCurrentCUDAStream().stream());
    return out;
}

static void register_relu(pybind11::module& m) {
    m.def("relu_forward", &relu_forward, py::arg("x"), py::arg("config") = 0);
}

REGISTER_BINDING(relu, register_relu);
