/* The KDA layer's L2 norm of each head's query or key, forward and backward, on [R, K] rows (R =
   B·T·H; kernels/kda/cpu.py, k3model/kda_layer.py):

       x̂ = x · ρ,   ρ = 1 / √max(Σ_i x_i², ε²)                         (F.normalize's value)
       dx = ρ (dx̂ − x̂ (x̂ · dx̂))   (where the clamp holds ρ = 1/ε and dx = dx̂ / ε)

   In torch (k3model/kda_layer.py's `_l2_normalize`) the square, sum, clamp, rsqrt and product and
   their backwards, ~10 passes over [B, T, H, K]; here one each way. Vectors along K (a multiple of
   W); each row's numbers depend on that row only (lane sums in a fixed order). */

#include "../vecmath.h"

#define HSUM(x) ({ vf h_ = (x); float s_ = 0.0f; for (int l_ = 0; l_ < W; ++l_) s_ += h_[l_]; s_; })

/* rows x [R, K] → x̂ [R, K] */
CLONES void kda_l2_norm_forward(const float *x, float *y, int64_t R, int64_t K, float eps) {
    for (int64_t n = 0; n < R; ++n) {
        const float *x_n = x + n * K;
        vf ss = splat(0.0f);
        for (int64_t i = 0; i < K; i += W) ss = ss + load(x_n + i) * load(x_n + i);
        const float s = HSUM(ss);
        const vf rho = splat(1.0f / __builtin_sqrtf(s > eps * eps ? s : eps * eps));
        for (int64_t i = 0; i < K; i += W) store(y + n * K + i, load(x_n + i) * rho);
    }
}

/* x̂ [R, K] (the forward's output), dx̂ → dx [R, K]; ρ recomputed from x */
CLONES void kda_l2_norm_backward(const float *x, const float *y, const float *dy, float *dx, int64_t R, int64_t K,
                                 float eps) {
    for (int64_t n = 0; n < R; ++n) {
        const float *x_n = x + n * K, *y_n = y + n * K, *dy_n = dy + n * K;
        vf ss = splat(0.0f), dot = splat(0.0f);
        for (int64_t i = 0; i < K; i += W) {
            ss = ss + load(x_n + i) * load(x_n + i);
            dot = dot + load(y_n + i) * load(dy_n + i);
        }
        const float s = HSUM(ss);
        const int clamped = s < eps * eps; /* torch's clamp_min passes the gradient at equality */
        const vf rho = splat(1.0f / __builtin_sqrtf(clamped ? eps * eps : s)), d = splat(clamped ? 0.0f : HSUM(dot));
        for (int64_t i = 0; i < K; i += W) store(dx + n * K + i, rho * (load(dy_n + i) - load(y_n + i) * d));
    }
}
