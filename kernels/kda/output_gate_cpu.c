/* The KDA layer's gated output, forward and backward, on [N, K] rows (N = B·T·H tokens × heads;
   kernels/kda/cpu.py, k3model/kda_layer.py). With c the output gate's logits and γ the per-head
   RMSNorm's weight:

       y  = σ(c) ⊙ γ ⊙ o · r_o,   r_o = 1 / √(mean(o²) + ε)
   backward, with x̂ = o · r_o and m = dy ⊙ σ(c) ⊙ γ:
       dc = dy ⊙ γ ⊙ x̂ ⊙ σ(1 − σ),   do = r_o (m − x̂ mean(m ⊙ x̂)),   dγ = Σ_rows dy ⊙ σ(c) ⊙ x̂ (double)

   In torch (RMSNorm's Function, sigmoid, the product and their backwards) about ten elementwise
   passes over [B, T, H, K]; here one each way. Vectors along K (a multiple of W); each row's
   numbers depend on that row only. */

#include "../vecmath.h"

typedef double vd __attribute__((vector_size(8 * W)));

static inline float hsum(vf x) {
    float s = 0.0f;
    for (int l = 0; l < W; ++l) s += x[l];
    return s;
}

/* o, c [N, K], gamma [K] → y [N, K] */
CLONES void kda_output_gate_forward(const float *o, const float *c, const float *gamma, float *y, int64_t N,
                                    int64_t K, float eps) {
    for (int64_t n = 0; n < N; ++n) {
        const int64_t off = n * K;
        vf acc = splat(0.0f);
        for (int64_t i = 0; i < K; i += W) acc = acc + load(o + off + i) * load(o + off + i);
        const vf r = splat(1.0f / __builtin_sqrtf(hsum(acc) / (float)K + eps));
        for (int64_t i = 0; i < K; i += W)
            store(y + off + i, sigmoid_vf(load(c + off + i)) * (load(o + off + i) * r * load(gamma + i)));
    }
}

/* dy [N, K] → do, dc [N, K], dgamma [K] (double, accumulated into: pass zeros) */
CLONES void kda_output_gate_backward(const float *o, const float *c, const float *gamma, const float *dy,
                                     float *do_, float *dc, double *dgamma, int64_t N, int64_t K, float eps) {
    for (int64_t n = 0; n < N; ++n) {
        const int64_t off = n * K;
        vf acc = splat(0.0f);
        for (int64_t i = 0; i < K; i += W) acc = acc + load(o + off + i) * load(o + off + i);
        const vf r = splat(1.0f / __builtin_sqrtf(hsum(acc) / (float)K + eps));
        vf dot = splat(0.0f);
        for (int64_t i = 0; i < K; i += W) {
            const vf s = sigmoid_vf(load(c + off + i)), xh = load(o + off + i) * r, gm = load(gamma + i);
            const vf dys = load(dy + off + i) * s;
            store(do_ + off + i, s); /* kept for the second loop, which overwrites it */
            store(dc + off + i, load(dy + off + i) * gm * xh * s * (splat(1.0f) - s));
            dot = dot + dys * gm * xh;
            vd acc_g;
            memcpy(&acc_g, dgamma + i, sizeof acc_g);
            acc_g = acc_g + __builtin_convertvector(dys * xh, vd);
            memcpy(dgamma + i, &acc_g, sizeof acc_g);
        }
        const vf mean = splat(hsum(dot) / (float)K);
        for (int64_t i = 0; i < K; i += W) {
            const vf s = load(do_ + off + i), xh = load(o + off + i) * r;
            store(do_ + off + i, r * (load(dy + off + i) * s * load(gamma + i) - xh * mean));
        }
    }
}
