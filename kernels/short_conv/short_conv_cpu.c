/* The KDA short convolution with its SiLU, forward and backward, on [B, T, C] rows in place
   (kernels/short_conv/cpu.py). With W taps, history h (the state's last W − 1 inputs, or zeros):

       p[b, t, c]  = Σ_{j=0}^{W−1} w[j, c] · x̃[b, t + j − (W − 1), c]      x̃ = x after h
       y           = p · σ(p)  (as p / (1 + e^{−p}))
       dp          = dy · σ(p) · (1 + p · (1 − σ(p)))
       dx[b, s, c] = Σ_j w[j, c] · dp[b, s + (W − 1) − j, c]               (taps inside [0, T))
       dw[j, c]    = Σ_{b,t} dp[b, t, c] · x̃[b, t + j − (W − 1), c]         summed in double

   The torch path transposes to [B, C, T] for conv1d and back, and runs SiLU and its backward on
   the transposed memory; here every pass reads C-contiguous rows, vectorised over channels (C a
   multiple of W_VEC). The backward recomputes p from x. Sums run over the taps in order j = 0..W−1;
   each channel's numbers depend on its own row only (vecmath.h). */

#include "../vecmath.h"

typedef double vd __attribute__((vector_size(8 * W)));

/* x̃[b, u, c..c+7] for u in [−(K−1), T): the input, or the history before it */
static inline vf tap(const float *x_b, const float *state_b, int64_t u, int64_t c, int64_t C, int64_t K) {
    if (u >= 0) return load(x_b + u * C + c);
    vf h = splat(0.0f);
    if (state_b) {
        /* state is [C, K − 1]: input u (< 0) is column K − 1 + u */
        for (int l = 0; l < W; ++l) h[l] = state_b[(c + l) * (K - 1) + (K - 1 + u)];
    }
    return h;
}

static inline vf preact(const float *x_b, const float *state_b, const float *wt, int64_t t, int64_t c,
                        int64_t C, int64_t K) {
    vf p = splat(0.0f);
    for (int64_t j = 0; j < K; ++j) p = p + load(wt + j * C + c) * tap(x_b, state_b, t + j - (K - 1), c, C, K);
    return p;
}

/* x [B, T, C], state [B, C, K − 1] or NULL, wt [K, C] (the weight transposed) → y [B, T, C] */
CLONES void short_conv_silu_forward(const float *x, const float *state, const float *wt, float *y,
                                    int64_t B, int64_t T, int64_t C, int64_t K) {
    for (int64_t b = 0; b < B; ++b) {
        const float *x_b = x + b * T * C, *state_b = state ? state + b * C * (K - 1) : 0;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < C; c += W) {
                vf p = preact(x_b, state_b, wt, t, c, C, K);
                store(y + (b * T + t) * C + c, p / (splat(1.0f) + exp_vf(-p)));
            }
    }
}

/* dy [B, T, C] → dx [B, T, C], dwt [K, C] (double, accumulated into: pass zeros); dp is scratch
   [B, T, C]. */
CLONES void short_conv_silu_backward(const float *x, const float *state, const float *wt, const float *dy,
                                     float *dp, float *dx, double *dwt, int64_t B, int64_t T, int64_t C,
                                     int64_t K) {
    for (int64_t b = 0; b < B; ++b) {
        const float *x_b = x + b * T * C, *state_b = state ? state + b * C * (K - 1) : 0;
        float *dp_b = dp + b * T * C;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < C; c += W) {
                vf p = preact(x_b, state_b, wt, t, c, C, K);
                vf s = sigmoid_vf(p);
                vf d = load(dy + (b * T + t) * C + c) * s * (splat(1.0f) + p * (splat(1.0f) - s));
                store(dp_b + t * C + c, d);
                for (int64_t j = 0; j < K; ++j) {
                    vd acc;
                    memcpy(&acc, dwt + j * C + c, sizeof acc);
                    acc = acc + __builtin_convertvector(d, vd) *
                                __builtin_convertvector(tap(x_b, state_b, t + j - (K - 1), c, C, K), vd);
                    memcpy(dwt + j * C + c, &acc, sizeof acc);
                }
            }
        for (int64_t s = 0; s < T; ++s)
            for (int64_t c = 0; c < C; c += W) {
                vf g = splat(0.0f);
                for (int64_t j = 0; j < K; ++j) {
                    int64_t t = s + (K - 1) - j;
                    if (t < T) g = g + load(wt + j * C + c) * load(dp_b + t * C + c);
                }
                store(dx + (b * T + s) * C + c, g);
            }
    }
}
