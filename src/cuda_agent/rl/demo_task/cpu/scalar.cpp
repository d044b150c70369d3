// B: one fused pass on one thread.
#include <algorithm>
#include <cstdint>

extern "C" void affine_relu_launcher(float* out, const float* x, float scale, float shift, int64_t n, int threads) {
    (void)threads;
    for (int64_t i = 0; i < n; ++i) out[i] = std::max(x[i] * scale + shift, 0.f) * 0.5f;
}
