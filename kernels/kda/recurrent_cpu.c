/* KDA by its token recurrence, forward and backward, for the CPU training step
   (kernels/kda/cpu.py). Per batch row b and head h, with state S ∈ R^{K×V} (naive.py's reference):

       S_a = Diag(e^{g_t}) S_{t−1}          row i decays by e^{g_t[i]}
       r_t = v_t − S_aᵀ k_t,   u_t = β_t r_t
       S_t = S_a + k_t u_tᵀ
       o_t = S_tᵀ (scale · q_t)

   Backward, dS the gradient of S_t (from o_{t+1..}, the final state's gradient at the end):

       dS    += (scale · q_t) do_tᵀ          dq_t = scale · S_t do_t
       du     = dSᵀ k_t,                     dk_t = dS u_t
       dβ_t   = du · r_t,  dv_t = β_t du,    dp = −β_t du
       dS_a   = dS + k_t dpᵀ,                dk_t += S_a dp,   dg_t[i] = Σ_j dS_a[i, j] S_a[i, j]
       dS     = Diag(e^{g_t}) dS_a           (the gradient of S_{t−1}; of the initial state at t = 0)

   At the tiny profile's head width (K = V = 32) the recurrence does ~4·K·V multiply-adds a token
   forward, fewer than the chunked form's 64×64 score blocks, and none of its exponent factors or
   triangular solve. The forward saves the state every L tokens; the backward recomputes each
   L-token stretch from its checkpoint (states, e^g, r, u) and walks it in reverse. Vectors run
   along V (V a multiple of RW), sums along V in one fixed order, so each (b, h) gets the same bits
   whatever the batch. Rows (b, h) in [bh0, bh1) only: the caller splits them across threads.

   Each token's two passes over S are fused with the neighbour's: forward, the update of token t
   (S += k uᵀ, o) and the decay of token t + 1 (S ⊙ e^g, the prediction Sᵀk) run in one pass over
   the rows; backward, token t's second pass and token t − 1's first, which read the same S_{t−1}.
   V = 32 (the tiny profile) is compiled with the width known, so the V-vectors stay in registers. */

#include "../vecmath.h"
#include <stddef.h>

/* stdlib.h would declare select(), which vecmath.h names its own */
void *malloc(size_t size);
void free(void *ptr);

#define VMAX 256 /* widest V: the per-token vectors live in fixed arrays */

/* Along V the kernel works in vectors of RW = 16 floats (V a multiple of 16): one AVX-512 register,
   half the instructions of vecmath.h's 8-float vectors in the loops over S (2.x× faster on this
   machine's Zen 5, which has full-width AVX-512 units); the AVX2 and default clones split each into
   two or four, the same IEEE operations per lane. Along K (e^g) it uses vecmath.h's vf. */
#define RW 16
typedef float vr __attribute__((vector_size(4 * RW)));

/* Macros, not functions: GCC lowers a helper's 64-byte vectors for the default target before it is
   inlined into a clone (each broadcast became 16 masked inserts, the kernel 2× slower than with
   8-float vectors); written in place, they compile for the clone's instruction set. */
#define spr(x) ({ const float x_ = (x); (vr){x_, x_, x_, x_, x_, x_, x_, x_, x_, x_, x_, x_, x_, x_, x_, x_}; })
#define ldr(p) ({ vr v_; memcpy(&v_, (p), sizeof v_); v_; })
#define str_(p, x) do { const vr v_ = (x); memcpy((p), &v_, sizeof v_); } while (0)
/* The sum of a vector's 16 lanes as a fixed tree: the two halves added as vectors, then those
   8 lanes pairwise (the serial 15 additions were a third of the backward's instructions). */
#define hsum(x) ({ const vr h_ = (x); vf lo_, hi_; memcpy(&lo_, &h_, sizeof lo_); \
                   memcpy(&hi_, (const char *)&h_ + sizeof lo_, sizeof hi_); const vf s_ = lo_ + hi_; \
                   ((s_[0] + s_[1]) + (s_[2] + s_[3])) + ((s_[4] + s_[5]) + (s_[6] + s_[7])); })


/* Tokens [t0, t0 + n) of row (b, h), starting from S = S_{t0−1} (undecayed) in place; afterwards
   S = S_{t0+n−1}. Writes o (when o is not NULL), the state after each token into states[i·KV]
   (when not NULL), the state before every L-th token into ckpt[(t / L)·KV] (when not NULL), and
   e^g, r, u per token into eg_out [n, K], r_out, u_out [n, V] (when not NULL). */
static inline __attribute__((always_inline)) void run_tokens(
        float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
        float *o, float *states, float *ckpt, float *eg_out, float *r_out, float *u_out,
        int64_t b, int64_t h, int64_t t0, int64_t n, int64_t T, int64_t H, int64_t K, const int64_t V,
        float scale, int64_t L, float *eg_cur, float *eg_next) {
    const int64_t KV = K * V, NV = V / RW;
    vr p[VMAX / RW], u[VMAX / RW], acc_o[VMAX / RW];
    /* the first token's decay and prediction */
    {
        const int64_t row = (b * T + t0) * H + h;
        if (ckpt && t0 % L == 0) memcpy(ckpt + (t0 / L) * KV, S, sizeof(float) * KV);
        for (int64_t i = 0; i < K; i += W) store(eg_cur + i, exp_vf(load(g + row * K + i)));
        for (int64_t jj = 0; jj < NV; ++jj) p[jj] = spr(0.0f);
        for (int64_t i = 0; i < K; ++i) {
            const vr e = spr(eg_cur[i]), kk = spr(k[row * K + i]);
            for (int64_t jj = 0; jj < NV; ++jj) {
                const vr s = ldr(S + i * V + jj * RW) * e;
                str_(S + i * V + jj * RW, s);
                p[jj] = p[jj] + s * kk;
            }
        }
    }
    for (int64_t m = 0; m < n; ++m) {
        const int64_t t = t0 + m, row = (b * T + t) * H + h, nrow = row + H;
        const int next = m + 1 < n;
        const vr bt = spr(beta[row]);
        for (int64_t jj = 0; jj < NV; ++jj) {
            const vr r = ldr(v + row * V + jj * RW) - p[jj];
            u[jj] = r * bt;
            if (r_out) str_(r_out + m * V + jj * RW, r);
            if (u_out) str_(u_out + m * V + jj * RW, u[jj]);
            acc_o[jj] = spr(0.0f);
            p[jj] = spr(0.0f);
        }
        if (eg_out) memcpy(eg_out + m * K, eg_cur, sizeof(float) * K);
        if (next)
            for (int64_t i = 0; i < K; i += W) store(eg_next + i, exp_vf(load(g + nrow * K + i)));
        float *st = states ? states + m * KV : 0;
        float *ck = ckpt && next && (t + 1) % L == 0 ? ckpt + ((t + 1) / L) * KV : 0;
        for (int64_t i = 0; i < K; ++i) {
            const vr kk = spr(k[row * K + i]), qq = spr(scale * q[row * K + i]);
            const vr e = spr(next ? eg_next[i] : 0.0f), kn = spr(next ? k[nrow * K + i] : 0.0f);
            for (int64_t jj = 0; jj < NV; ++jj) {
                vr s = ldr(S + i * V + jj * RW) + kk * u[jj];
                acc_o[jj] = acc_o[jj] + s * qq;
                if (st) str_(st + i * V + jj * RW, s);
                if (ck) str_(ck + i * V + jj * RW, s);
                if (next) {
                    s = s * e;
                    p[jj] = p[jj] + s * kn;
                }
                str_(S + i * V + jj * RW, s);
            }
        }
        if (o)
            for (int64_t jj = 0; jj < NV; ++jj) str_(o + row * V + jj * RW, acc_o[jj]);
        float *swap = eg_cur;
        eg_cur = eg_next;
        eg_next = swap;
    }
}

static inline __attribute__((always_inline)) void forward_rows(
        const float *q, const float *k, const float *v, const float *g, const float *beta, const float *s0,
        float *o, float *s_final, float *ckpt, int64_t T, int64_t H, int64_t K, const int64_t V, float scale,
        int64_t L, int64_t bh0, int64_t bh1) {
    const int64_t KV = K * V, NC = (T + L - 1) / L;
    float *eg = malloc(sizeof(float) * 2 * K);
    for (int64_t bh = bh0; bh < bh1; ++bh) {
        float *S = s_final + bh * KV;
        if (s0) memcpy(S, s0 + bh * KV, sizeof(float) * KV);
        else memset(S, 0, sizeof(float) * KV);
        run_tokens(S, q, k, v, g, beta, o, 0, ckpt ? ckpt + bh * NC * KV : 0, 0, 0, 0, bh / H, bh % H, 0, T, T,
                   H, K, V, scale, L, eg, eg + K);
    }
    free(eg);
}

/* q, k, g [B, T, H, K], v [B, T, H, V], beta [B, T, H], s0 [B, H, K, V] or NULL → o [B, T, H, V],
   s_final [B, H, K, V]; ckpt [B·H, ceil(T/L), K, V] (the state before tokens 0, L, 2L, …) unless NULL. */
CLONES void kda_recurrent_forward(const float *q, const float *k, const float *v, const float *g,
                                  const float *beta, const float *s0, float *o, float *s_final, float *ckpt,
                                  int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, float scale,
                                  int64_t L, int64_t bh0, int64_t bh1) {
    (void)B;
    if (V == 32) forward_rows(q, k, v, g, beta, s0, o, s_final, ckpt, T, H, K, 32, scale, L, bh0, bh1);
    else forward_rows(q, k, v, g, beta, s0, o, s_final, ckpt, T, H, K, V, scale, L, bh0, bh1);
}

/* Token t's first backward pass over the rows, from dS (the gradient of S_t, updated in place to
   include o_t's): dq_t, the dS·u half of dk_t (into dk1), du; then dβ_t, dv_t and dp (returned). */
static inline __attribute__((always_inline)) void first_pass(
        float *dS, const float *St, const float *qt, const float *kt, const float *dot, const float *u,
        float *dq_t, float *dk1, vr *du, int64_t K, const int64_t V, float scale) {
    const int64_t NV = V / RW;
    /* loaded once: the stores into dS could alias them, so the compiler would reload every row */
    vr dov[VMAX / RW], uv[VMAX / RW];
    for (int64_t jj = 0; jj < NV; ++jj) {
        du[jj] = spr(0.0f);
        dov[jj] = ldr(dot + jj * RW);
        uv[jj] = ldr(u + jj * RW);
    }
    for (int64_t a = 0; a < K; ++a) {
        const vr qq = spr(scale * qt[a]), kk = spr(kt[a]);
        vr accq = spr(0.0f), acck = spr(0.0f);
        for (int64_t jj = 0; jj < NV; ++jj) {
            accq = accq + ldr(St + a * V + jj * RW) * dov[jj];
            const vr ds = ldr(dS + a * V + jj * RW) + qq * dov[jj];
            str_(dS + a * V + jj * RW, ds);
            du[jj] = du[jj] + ds * kk;
            acck = acck + ds * uv[jj];
        }
        dq_t[a] = scale * hsum(accq);
        dk1[a] = hsum(acck);
    }
}

static inline __attribute__((always_inline)) void backward_rows(
        const float *q, const float *k, const float *v, const float *g, const float *beta, const float *ckpt,
        const float *do_, const float *ds_final, float *dq, float *dk, float *dv, float *dg, float *dbeta,
        float *ds0, int64_t T, int64_t H, int64_t K, const int64_t V, float scale, int64_t L, int64_t bh0,
        int64_t bh1) {
    const int64_t KV = K * V, NC = (T + L - 1) / L, NV = V / RW;
    /* the stretch's states (before its first token, after each), e^g, r, u per token, dS, two dk
       halves, two e^g rows, and the running (decayed) state run_tokens works on */
    float *Sbuf = malloc(sizeof(float) * ((L + 1) * KV + L * (K + 2 * V) + 2 * KV + 4 * K));
    float *egbuf = Sbuf + (L + 1) * KV, *rbuf = egbuf + L * K, *ubuf = rbuf + L * V;
    float *dS = ubuf + L * V, *dk1 = dS + KV, *dk1_prev = dk1 + K, *eg_a = dk1_prev + K, *eg_b = eg_a + K;
    float *work = eg_b + K;
    vr du[VMAX / RW], dp[VMAX / RW], du_prev[VMAX / RW];
    for (int64_t bh = bh0; bh < bh1; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        memcpy(dS, ds_final + bh * KV, sizeof(float) * KV);
        for (int64_t c = NC - 1; c >= 0; --c) {
            const int64_t t0 = c * L, n = T - t0 < L ? T - t0 : L;
            memcpy(Sbuf, ckpt + (bh * NC + c) * KV, sizeof(float) * KV);
            memcpy(work, Sbuf, sizeof(float) * KV);
            run_tokens(work, q, k, v, g, beta, 0, Sbuf + KV, 0, egbuf, rbuf, ubuf, b, h, t0, n, T, H, K, V,
                       scale, L, eg_a, eg_b);
            {
                const int64_t row = (b * T + t0 + n - 1) * H + h;
                first_pass(dS, Sbuf + n * KV, q + row * K, k + row * K, do_ + row * V, ubuf + (n - 1) * V,
                           dq + row * K, dk1, du, K, V, scale);
            }
            for (int64_t i = n - 1; i >= 0; --i) {
                const int64_t row = (b * T + t0 + i) * H + h, prow = row - H;
                const int prev = i > 0;
                const float *kt = k + row * K, *Sp = Sbuf + i * KV, *eg = egbuf + i * K, *r = rbuf + i * V;
                const vr bt = spr(beta[row]);
                vr accb = spr(0.0f);
                for (int64_t jj = 0; jj < NV; ++jj) {
                    accb = accb + du[jj] * ldr(r + jj * RW);
                    str_(dv + row * V + jj * RW, du[jj] * bt);
                    dp[jj] = du[jj] * -bt;
                    du_prev[jj] = spr(0.0f);
                }
                dbeta[row] = hsum(accb);
                /* token t's second pass, fused with token t − 1's first (both read S_{t−1} = Sp) */
                const float *qp = q + prow * K, *kp = k + prow * K;
                vr dov[VMAX / RW], upv[VMAX / RW];
                for (int64_t jj = 0; jj < NV; ++jj) {
                    dov[jj] = prev ? ldr(do_ + prow * V + jj * RW) : spr(0.0f);
                    upv[jj] = prev ? ldr(ubuf + (i - 1) * V + jj * RW) : spr(0.0f);
                }
                for (int64_t a = 0; a < K; ++a) {
                    const vr e = spr(eg[a]), kk = spr(kt[a]);
                    const vr qq = spr(prev ? scale * qp[a] : 0.0f), kkp = spr(prev ? kp[a] : 0.0f);
                    vr acck = spr(0.0f), accg = spr(0.0f), accq = spr(0.0f), acck_p = spr(0.0f);
                    for (int64_t jj = 0; jj < NV; ++jj) {
                        const vr sp = ldr(Sp + a * V + jj * RW), sa = sp * e;
                        const vr dsa = ldr(dS + a * V + jj * RW) + kk * dp[jj];
                        acck = acck + sa * dp[jj];
                        accg = accg + dsa * sa;
                        vr ds = dsa * e;
                        if (prev) {
                            accq = accq + sp * dov[jj];
                            ds = ds + qq * dov[jj];
                            du_prev[jj] = du_prev[jj] + ds * kkp;
                            acck_p = acck_p + ds * upv[jj];
                        }
                        str_(dS + a * V + jj * RW, ds);
                    }
                    dk[row * K + a] = dk1[a] + hsum(acck);
                    dg[row * K + a] = hsum(accg);
                    if (prev) {
                        dq[prow * K + a] = scale * hsum(accq);
                        dk1_prev[a] = hsum(acck_p);
                    }
                }
                if (prev) {
                    for (int64_t jj = 0; jj < NV; ++jj) du[jj] = du_prev[jj];
                    float *swap = dk1;
                    dk1 = dk1_prev;
                    dk1_prev = swap;
                }
            }
        }
        if (ds0) memcpy(ds0 + bh * KV, dS, sizeof(float) * KV);
    }
    /* dk1 and dk1_prev may have swapped: free the block through its start */
    free(Sbuf);
}

/* do_ [B, T, H, V], ds_final [B, H, K, V] → dq, dk, dg [B, T, H, K], dv [B, T, H, V], dbeta [B, T, H],
   ds0 [B, H, K, V] unless NULL; every element written. */
CLONES void kda_recurrent_backward(const float *q, const float *k, const float *v, const float *g,
                                   const float *beta, const float *ckpt, const float *do_,
                                   const float *ds_final, float *dq, float *dk, float *dv, float *dg,
                                   float *dbeta, float *ds0, int64_t B, int64_t T, int64_t H, int64_t K,
                                   int64_t V, float scale, int64_t L, int64_t bh0, int64_t bh1) {
    (void)B;
    if (V == 32)
        backward_rows(q, k, v, g, beta, ckpt, do_, ds_final, dq, dk, dv, dg, dbeta, ds0, T, H, K, 32, scale, L,
                      bh0, bh1);
    else
        backward_rows(q, k, v, g, beta, ckpt, do_, ds_final, dq, dk, dv, dg, dbeta, ds0, T, H, K, V, scale, L,
                      bh0, bh1);
}
