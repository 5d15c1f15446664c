/* The KDA layer's per-token inputs to the recurrence, forward and backward, on [N, K] rows
   (N = B·T·H tokens × heads, head h = n mod H; kernels/kda/cpu.py). With ε the norm's epsilon,
   a_h = e^{A_h} and lb the gate's lower bound (k3model/kda_layer.py):

       q  = q̃ · r_q,   r_q = 1 / √max(Σ q̃², ε²)       (the same for k)
       g  = lb · σ(a_h z)
   backward:
       dq̃ = r_q (dq − q (q · dq))   where Σ q̃² > ε², else r_q dq
       dz = dg · lb · σ(1 − σ) · a_h,   da_h = Σ_{rows of h} Σ_d dg · lb · σ(1 − σ) · z   (in double)

   and after the recurrence, with c the output gate's logits and γ the per-head RMSNorm's weight:

       y  = σ(c) ⊙ γ ⊙ o · r_o,   r_o = 1 / √(mean(o²) + ε_o)
   backward, with x̂ = o · r_o and m = dy ⊙ σ(c) ⊙ γ:
       dc = dy ⊙ γ ⊙ x̂ ⊙ σ(1 − σ),   do = r_o (m − x̂ mean(m ⊙ x̂)),   dγ = Σ_rows dy ⊙ σ(c) ⊙ x̂ (double)

   In torch these are ~35 elementwise passes over [B, T, H, K] forward and backward; here one
   each way. Vectors along K (a multiple of W); each row's numbers depend on that row only. */

#include "../vecmath.h"

typedef double vd __attribute__((vector_size(8 * W)));

static inline float hsum(vf x) {
    float s = 0.0f;
    for (int l = 0; l < W; ++l) s += x[l];
    return s;
}

static inline float inv_norm(const float *x, int64_t K, float eps2, int *clamped) {
    vf acc = splat(0.0f);
    for (int64_t i = 0; i < K; i += W) {
        const vf v = load(x + i);
        acc = acc + v * v;
    }
    const float s = hsum(acc);
    *clamped = !(s > eps2);
    return 1.0f / __builtin_sqrtf(*clamped ? eps2 : s);
}

/* qr, kr, z [N, K], a [H] → q, k, g [N, K] */
CLONES void kda_gates_forward(const float *qr, const float *kr, const float *z, const float *a, float *q,
                              float *k, float *g, int64_t N, int64_t H, int64_t K, float lb, float eps) {
    const float eps2 = eps * eps;
    for (int64_t n = 0; n < N; ++n) {
        const int64_t o = n * K;
        int clamped;
        const vf rq = splat(inv_norm(qr + o, K, eps2, &clamped)), rk = splat(inv_norm(kr + o, K, eps2, &clamped));
        const vf ah = splat(a[n % H]);
        for (int64_t i = 0; i < K; i += W) {
            store(q + o + i, load(qr + o + i) * rq);
            store(k + o + i, load(kr + o + i) * rk);
            store(g + o + i, splat(lb) * sigmoid_vf(ah * load(z + o + i)));
        }
    }
}

static inline void norm_backward(const float *xr, const float *dx, float *dxr, int64_t K, float eps2) {
    int clamped;
    const float r = inv_norm(xr, K, eps2, &clamped);
    vf acc = splat(0.0f);
    for (int64_t i = 0; i < K; i += W) acc = acc + load(xr + i) * splat(r) * load(dx + i);
    const vf dot = splat(clamped ? 0.0f : hsum(acc));
    for (int64_t i = 0; i < K; i += W) {
        const vf x = load(xr + i) * splat(r);
        store(dxr + i, splat(r) * (load(dx + i) - x * dot));
    }
}

/* dq, dk, dg [N, K] → dqr, dkr, dz [N, K], da [H] (double, accumulated into: pass zeros) */
CLONES void kda_gates_backward(const float *qr, const float *kr, const float *z, const float *a,
                               const float *dq, const float *dk, const float *dg, float *dqr, float *dkr,
                               float *dz, double *da, int64_t N, int64_t H, int64_t K, float lb, float eps) {
    const float eps2 = eps * eps;
    for (int64_t n = 0; n < N; ++n) {
        const int64_t o = n * K;
        norm_backward(qr + o, dq + o, dqr + o, K, eps2);
        norm_backward(kr + o, dk + o, dkr + o, K, eps2);
        const vf ah = splat(a[n % H]);
        vf acc = splat(0.0f);
        for (int64_t i = 0; i < K; i += W) {
            const vf zi = load(z + o + i), s = sigmoid_vf(ah * zi);
            const vf d = load(dg + o + i) * splat(lb) * s * (splat(1.0f) - s);
            store(dz + o + i, d * ah);
            acc = acc + d * zi;
        }
        da[n % H] += (double)hsum(acc);
    }
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
