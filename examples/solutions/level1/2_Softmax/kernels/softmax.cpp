// Row softmax, one row per OpenMP iteration: the row's max, then exp(x - max) written and summed, then scaled.
#include <algorithm>
#include <cmath>
#include <cstdint>

extern "C" void softmax_launcher(float* out, const float* x, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* in = x + r * cols;
        float* o = out + r * cols;
        float top = -INFINITY;
#pragma omp simd reduction(max : top)
        for (int64_t c = 0; c < cols; ++c) top = std::max(top, in[c]);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < cols; ++c) {
            o[c] = std::exp(in[c] - top);
            sum += o[c];
        }
        const float scale = 1.f / sum;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) o[c] *= scale;
    }
}
