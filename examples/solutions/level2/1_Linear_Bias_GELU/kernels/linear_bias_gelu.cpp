// out = gelu(x @ w.T + bias) in one pass: each output element is a dot product of a row of x and a row of w
// (both contiguous), four rows of w at a time so each load of x serves four sums; bias and GELU are applied
// before the element is stored, so nothing is written twice.
#include <cmath>
#include <cstdint>

static inline float gelu(float v) { return 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f)); }

extern "C" void linear_bias_gelu_launcher(float* out, const float* x, const float* w, const float* bias,
                                          int64_t batch, int64_t in, int64_t outs) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t o = 0; o < outs; o += 4) {
            const float* xr = x + b * in;
            float* dst = out + b * outs;
            if (o + 4 <= outs) {
                const float *w0 = w + o * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
                float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
                for (int64_t k = 0; k < in; ++k) {
                    s0 += xr[k] * w0[k];
                    s1 += xr[k] * w1[k];
                    s2 += xr[k] * w2[k];
                    s3 += xr[k] * w3[k];
                }
                dst[o] = gelu(s0 + bias[o]);
                dst[o + 1] = gelu(s1 + bias[o + 1]);
                dst[o + 2] = gelu(s2 + bias[o + 2]);
                dst[o + 3] = gelu(s3 + bias[o + 3]);
            } else {  // the last outs % 4 columns
                for (int64_t j = o; j < outs; ++j) {
                    const float* wr = w + j * in;
                    float s = 0.f;
#pragma omp simd reduction(+ : s)
                    for (int64_t k = 0; k < in; ++k) s += xr[k] * wr[k];
                    dst[j] = gelu(s + bias[j]);
                }
            }
        }
    }
}
