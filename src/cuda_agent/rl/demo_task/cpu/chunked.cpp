// D: one thread, visiting the elements with a stride of 4096 floats (a cache miss on nearly every access).
#include <algorithm>
#include <cstdint>

extern "C" void affine_relu_launcher(float* out, const float* x, float scale, float shift, int64_t n, int threads) {
    (void)threads;
    constexpr int64_t STRIDE = 4096;
    for (int64_t start = 0; start < STRIDE; ++start)
        for (int64_t i = start; i < n; i += STRIDE) out[i] = std::max(x[i] * scale + shift, 0.f) * 0.5f;
}
