/* Block attention residuals' depth mix, forward and backward, on [M, D] rows (M = B·T tokens;
   kernels/attn_res/cpu.py, k3model/attn_res.py). With N sources v_i, the pseudo-query folded into
   the key norm's weight, q = γ ⊙ w, and per token:

       r_i = 1 / √(mean(v_i²) + ε),   d_i = v_i · q,   l_i = r_i d_i,   α = softmax_i(l),   h = Σ_i α_i v_i
   backward, with a_i = dh · v_i and dl_i = α_i (a_i − Σ_j α_j a_j):
       dv_i = α_i dh + dl_i r_i q − dl_i d_i r_i³ v_i / D,    dq = Σ_tokens Σ_i dl_i r_i v_i   (double)

   In torch (per source: square, mean, rsqrt, product, sum; stack, the padded softmax, N products and
   sums, and the backwards of all of them) ~25 passes over the sources; here one each way and a
   second read in the backward. Vectors along D (a multiple of W); each token's numbers depend on
   its own row only (lane sums in a fixed order), so a row gets the same bits in any batch. */

#include "../vecmath.h"

typedef double vd __attribute__((vector_size(8 * W)));

#define NMAX 64 /* sources per call (cpu.py checks) */

#define HSUM(x) ({ vf h_ = (x); float s_ = 0.0f; for (int l_ = 0; l_ < W; ++l_) s_ += h_[l_]; s_; })

/* softmax over n ≤ NMAX logits in place, exponents through exp_vf (no libm, the same bits anywhere) */
static inline void softmax_n(float *l, int64_t n) {
    float mx = l[0];
    for (int64_t i = 1; i < n; ++i) mx = l[i] > mx ? l[i] : mx;
    float e[NMAX + W];
    for (int64_t i = 0; i < n; i += W) {
        vf x = splat(-100.0f);
        for (int j = 0; j < W && i + j < n; ++j) x[j] = l[i + j] - mx;
        vf y = exp_vf(x);
        for (int j = 0; j < W; ++j) e[i + j] = y[j];
    }
    float z = 0.0f;
    for (int64_t i = 0; i < n; ++i) z += e[i];
    for (int64_t i = 0; i < n; ++i) l[i] = e[i] / z;
}

/* src: N pointers to [M, D]; q [D] → h [M, D]; alpha, r, dot [M, N] (kept for the backward) */
CLONES void attn_res_forward(const float *const *src, const float *q, float *h, float *alpha, float *r,
                             float *dot, int64_t N, int64_t M, int64_t D, float eps) {
    for (int64_t m = 0; m < M; ++m) {
        const int64_t off = m * D;
        float *a_m = alpha + m * N;
        for (int64_t i = 0; i < N; ++i) {
            const float *v = src[i] + off;
            vf ss = splat(0.0f), dq = splat(0.0f);
            for (int64_t c = 0; c < D; c += W) {
                const vf x = load(v + c);
                ss = ss + x * x;
                dq = dq + x * load(q + c);
            }
            const float r_i = 1.0f / __builtin_sqrtf(HSUM(ss) / (float)D + eps), d_i = HSUM(dq);
            r[m * N + i] = r_i;
            dot[m * N + i] = d_i;
            a_m[i] = r_i * d_i;
        }
        softmax_n(a_m, N);
        for (int64_t c = 0; c < D; c += W) {
            vf acc = splat(a_m[0]) * load(src[0] + off + c);
            for (int64_t i = 1; i < N; ++i) acc = acc + splat(a_m[i]) * load(src[i] + off + c);
            store(h + off + c, acc);
        }
    }
}

/* dh [M, D] → dsrc: N pointers to [M, D] (written); dq [D] double (accumulated into: pass zeros) */
CLONES void attn_res_backward(const float *const *src, const float *q, const float *alpha, const float *r,
                              const float *dot, const float *dh, float *const *dsrc, double *dq, int64_t N,
                              int64_t M, int64_t D) {
    float dl[NMAX];
    for (int64_t m = 0; m < M; ++m) {
        const int64_t off = m * D;
        const float *a_m = alpha + m * N;
        float s = 0.0f;
        for (int64_t i = 0; i < N; ++i) {
            vf acc = splat(0.0f);
            for (int64_t c = 0; c < D; c += W) acc = acc + load(dh + off + c) * load(src[i] + off + c);
            dl[i] = HSUM(acc);
            s += a_m[i] * dl[i];
        }
        for (int64_t i = 0; i < N; ++i) {
            const float dl_i = a_m[i] * (dl[i] - s), r_i = r[m * N + i];
            const vf al = splat(a_m[i]), c1 = splat(dl_i * r_i);
            const vf c2 = splat(dl_i * dot[m * N + i] * r_i * r_i * r_i / (float)D);
            const float *v = src[i] + off;
            float *dv = dsrc[i] + off;
            for (int64_t c = 0; c < D; c += W) {
                const vf x = load(v + c);
                store(dv + c, al * load(dh + off + c) + c1 * load(q + c) - c2 * x);
                vd acc;
                memcpy(&acc, dq + c, sizeof acc);
                acc = acc + __builtin_convertvector(x, vd) * (double)(dl_i * r_i);
                memcpy(dq + c, &acc, sizeof acc);
            }
        }
    }
}
