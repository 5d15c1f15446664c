/* RMSNorm, forward and backward, on [M, D] rows (kernels/rms_norm/cpu.py, k3model/common.py):

       r = 1 / √(mean(x²) + ε),   x̂ = r x,   y = γ ⊙ x̂
   backward, with g = γ ⊙ dy:
       dx = r (g − x̂ · mean(g ⊙ x̂)),   dγ = Σ_rows dy ⊙ x̂   (double)

   In torch (the Function in k3model/common.py) five elementwise passes and a reduction forward and
   eight backward; here one each way. Vectors along D (a multiple of W); each row's numbers depend on
   that row only (lane sums in a fixed order). */

#include "../vecmath.h"

typedef double vd __attribute__((vector_size(8 * W)));

#define HSUM(x) ({ vf h_ = (x); float s_ = 0.0f; for (int l_ = 0; l_ < W; ++l_) s_ += h_[l_]; s_; })

/* x [M, D], gamma [D] → y [M, D], r [M] (kept for the backward) */
CLONES void rms_norm_forward(const float *x, const float *gamma, float *y, float *r, int64_t M, int64_t D,
                             float eps) {
    for (int64_t m = 0; m < M; ++m) {
        const float *x_m = x + m * D;
        vf ss = splat(0.0f);
        for (int64_t c = 0; c < D; c += W) ss = ss + load(x_m + c) * load(x_m + c);
        const float r_m = 1.0f / __builtin_sqrtf(HSUM(ss) / (float)D + eps);
        r[m] = r_m;
        const vf rv = splat(r_m);
        for (int64_t c = 0; c < D; c += W) store(y + m * D + c, load(x_m + c) * rv * load(gamma + c));
    }
}

/* dy [M, D] → dx [M, D], dgamma [D] double (accumulated into: pass zeros) */
CLONES void rms_norm_backward(const float *x, const float *gamma, const float *r, const float *dy, float *dx,
                              double *dgamma, int64_t M, int64_t D) {
    for (int64_t m = 0; m < M; ++m) {
        const float *x_m = x + m * D, *dy_m = dy + m * D;
        const vf rv = splat(r[m]);
        vf dot = splat(0.0f);
        for (int64_t c = 0; c < D; c += W) {
            const vf xh = load(x_m + c) * rv, d = load(dy_m + c);
            dot = dot + d * load(gamma + c) * xh;
            vd acc;
            memcpy(&acc, dgamma + c, sizeof acc);
            acc = acc + __builtin_convertvector(d, vd) * __builtin_convertvector(xh, vd);
            memcpy(dgamma + c, &acc, sizeof acc);
        }
        const vf mean = splat(HSUM(dot) / (float)D);
        for (int64_t c = 0; c < D; c += W) {
            const vf xh = load(x_m + c) * rv;
            store(dx + m * D + c, rv * (load(dy_m + c) * load(gamma + c) - xh * mean));
        }
    }
}
