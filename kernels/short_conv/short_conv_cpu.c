/* The KDA short convolution with its SiLU, forward and backward, on [B, T, C] rows in place
   (kernels/short_conv/cpu.py). With W taps, history h (the state's last W − 1 inputs, or zeros):

       p[b, t, c]  = Σ_{j=0}^{W−1} w[j, c] · x̃[b, t + j − (W − 1), c]      x̃ = x after h
       y           = p · σ(p)  (as p / (1 + e^{−p}))
       dp          = dy · σ(p) · (1 + p · (1 − σ(p)))
       dx[b, s, c] = Σ_j w[j, c] · dp[b, s + (W − 1) − j, c]               (taps inside [0, T))
       dw[j, c]    = Σ_{b,t} dp[b, t, c] · x̃[b, t + j − (W − 1), c]         summed in double

   The torch path transposes to [B, C, T] for conv1d and back, and runs SiLU and its backward on
   the transposed memory; here every pass reads C-contiguous rows, vectorised over channels: blocks
   of 16 (one AVX-512 register) and a last block of 8 when C is an odd multiple of 8, with vecmath.h's
   macros written in place (they compile for the clone; ~2× the 8-float helper functions on this
   machine, docs/log/tiny.md). The backward recomputes p from x and keeps each block's dw sums in
   double registers over the tokens of a row. Sums run over the taps in order j = 0..W−1; each
   channel's numbers depend on its own row only. */

#include "../vecmath.h"

#define RW 16
typedef float vr __attribute__((vector_size(4 * RW)));
typedef double vd8 __attribute__((vector_size(8 * 8)));
#define MAX_TAPS 16 /* the backward's register sums; wider kernels take the torch path (cpu.py) */

#define LD(T_, p) ({ T_ v_; memcpy(&v_, (p), sizeof v_); v_; })
#define ST(p, x) do { const V_T(x) v_ = (x); memcpy((p), &v_, sizeof v_); } while (0)

/* x̃[b, u, c..c+NL−1] for u in [−(K−1), T) as a vector of type T_: the input, or the history before it */
#define TAP(T_, NL, u, c) ({ const int64_t u_ = (u); T_ h_; \
    if (u_ >= 0) h_ = LD(T_, x_b + u_ * C + (c)); \
    else { h_ = (T_){}; \
           if (state_b) for (int l_ = 0; l_ < (NL); ++l_) h_[l_] = state_b[((c) + l_) * (KK - 1) + (KK - 1 + u_)]; } \
    h_; })

#define PREACT(T_, NL, t, c) ({ T_ p_ = (T_){}; \
    for (int64_t j_ = 0; j_ < KK; ++j_) p_ = p_ + LD(T_, wt + j_ * C + (c)) * TAP(T_, NL, (t) + j_ - (KK - 1), c); p_; })

#define FORWARD_BLOCK(T_, NL, c) \
    for (int64_t t = 0; t < T; ++t) { const T_ p = PREACT(T_, NL, t, c); \
        ST(y + (b * T + t) * C + (c), p / (1.0f + V_EXP(-p))); }

/* x [B, T, C], state [B, C, K − 1] or NULL, wt [K, C] (the weight transposed) → y [B, T, C] */
#define FORWARD_ROWS(KK) \
    for (int64_t b = 0; b < B; ++b) { \
        const float *x_b = x + b * T * C, *state_b = state ? state + b * C * ((KK) - 1) : 0; \
        int64_t c = 0; \
        for (; c + RW <= C; c += RW) { FORWARD_BLOCK(vr, RW, c) } \
        for (; c < C; c += W) { FORWARD_BLOCK(vf, W, c) } }

CLONES void short_conv_silu_forward(const float *x, const float *state, const float *wt, float *y,
                                    int64_t B, int64_t T, int64_t C, int64_t K) {
    /* Kimi's 4 taps compiled with the count known, so the tap loops unroll */
    if (K == 4) { const int64_t KK = 4; FORWARD_ROWS(KK) }
    else { const int64_t KK = K; FORWARD_ROWS(KK) }
}

/* One channel block of the backward for row b: dp (scratch) over the row's tokens, the dw sums in
   double (NL / 8 registers of 8 per tap), then dx. */
#define BACKWARD_BLOCK(T_, NL, c) { \
    vd8 acc[MAX_TAPS][(NL) / 8]; \
    for (int64_t j = 0; j < KK; ++j) for (int h = 0; h < (NL) / 8; ++h) acc[j][h] = (vd8){}; \
    for (int64_t t = 0; t < T; ++t) { \
        const T_ p = PREACT(T_, NL, t, c), s = V_SIGMOID(p); \
        const T_ d = LD(T_, dy + (b * T + t) * C + (c)) * s * (1.0f + p * (1.0f - s)); \
        ST(dp_b + t * C + (c), d); \
        for (int64_t j = 0; j < KK; ++j) { \
            const T_ xt = TAP(T_, NL, t + j - (KK - 1), c); \
            for (int h = 0; h < (NL) / 8; ++h) { \
                vf d8, x8; memcpy(&d8, (const float *)&d + 8 * h, sizeof d8); \
                memcpy(&x8, (const float *)&xt + 8 * h, sizeof x8); \
                acc[j][h] = acc[j][h] + __builtin_convertvector(d8, vd8) * __builtin_convertvector(x8, vd8); } } } \
    for (int64_t j = 0; j < KK; ++j) for (int h = 0; h < (NL) / 8; ++h) { \
        vd8 cur; memcpy(&cur, dwt + j * C + (c) + 8 * h, sizeof cur); cur = cur + acc[j][h]; \
        memcpy(dwt + j * C + (c) + 8 * h, &cur, sizeof cur); } \
    for (int64_t s = 0; s < T; ++s) { T_ g = (T_){}; \
        for (int64_t j = 0; j < KK; ++j) { const int64_t t = s + (KK - 1) - j; \
            if (t < T) g = g + LD(T_, wt + j * C + (c)) * LD(T_, dp_b + t * C + (c)); } \
        ST(dx + (b * T + s) * C + (c), g); } }

#define BACKWARD_ROWS(KK) \
    for (int64_t b = 0; b < B; ++b) { \
        const float *x_b = x + b * T * C, *state_b = state ? state + b * C * ((KK) - 1) : 0; \
        float *dp_b = dp; \
        int64_t c = 0; \
        for (; c + RW <= C; c += RW) BACKWARD_BLOCK(vr, RW, c) \
        for (; c < C; c += W) BACKWARD_BLOCK(vf, W, c) }

/* dy [B, T, C] → dx [B, T, C], dwt [K, C] (double, accumulated into: pass zeros); dp is scratch
   [T, C], reused row after row (it stays in cache; a [B, T, C] scratch was 1 MB of fresh pages a
   call at the tiny step). K ≤ MAX_TAPS. */
CLONES void short_conv_silu_backward(const float *x, const float *state, const float *wt, const float *dy,
                                     float *dp, float *dx, double *dwt, int64_t B, int64_t T, int64_t C,
                                     int64_t K) {
    if (K == 4) { const int64_t KK = 4; BACKWARD_ROWS(KK) }
    else { const int64_t KK = K; BACKWARD_ROWS(KK) }
}
