// Layer norm over each row, one row per OpenMP iteration: mean, then variance from the deviations (two passes
// over a row that stays in cache), then the normalised, scaled and shifted row.
#include <cmath>
#include <cstdint>

extern "C" void layer_norm_launcher(float* out, const float* x, const float* weight, const float* bias, float eps,
                                    int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* in = x + r * cols;
        float* o = out + r * cols;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < cols; ++c) sum += in[c];
        const float mean = sum / cols;
        float squares = 0.f;
#pragma omp simd reduction(+ : squares)
        for (int64_t c = 0; c < cols; ++c) squares += (in[c] - mean) * (in[c] - mean);
        const float inv_std = 1.f / std::sqrt(squares / cols + eps);
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) o[c] = (in[c] - mean) * inv_std * weight[c] + bias[c];
    }
}
