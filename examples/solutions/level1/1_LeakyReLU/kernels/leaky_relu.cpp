// Leaky ReLU in one vectorised OpenMP pass: out = x > 0 ? x : slope * x.
#include <cstdint>

extern "C" void leaky_relu_launcher(float* out, const float* x, float slope, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        out[i] = v > 0.f ? v : v * slope;
    }
}
