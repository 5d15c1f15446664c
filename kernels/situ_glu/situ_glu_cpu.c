/* SiTU-GLU forward and backward on the CPU, one pass over memory each (kernels/situ_glu/cpu.py).

       y  = a · b,   a = β1·t1·σ(g),   b = β2·t2,   t1 = tanh(g/β1),   t2 = tanh(v/β2)
       dg = dy · b · ((1 − t1²)·σ(g) + a·(1 − σ(g)))
       dv = dy · a · (1 − t2²)

   The backward recomputes t1, σ and t2 from g and v (two inputs saved instead of three
   intermediates). Vectors of RW = 16 floats (one AVX-512 register; the AVX2 and default clones
   split them), with vecmath.h's macros written in place: 1.8–2× faster than 8-float vectors on this
   machine's Zen 5 (docs/log/tiny.md), the same IEEE operations per lane, so the same bits. The tail
   of an array goes through the same vector code in a padded buffer (an element's bits do not depend
   on where it sits). */

#include "../vecmath.h"

#define RW 16
typedef float vr __attribute__((vector_size(4 * RW)));

/* Macros, not functions (see vecmath.h): they compile for the clone they sit in. */
#define ldr(p) ({ vr v_; memcpy(&v_, (p), sizeof v_); v_; })
#define str_(p, x) do { const vr v_ = (x); memcpy((p), &v_, sizeof v_); } while (0)
#define FORWARD(gin, vin) ({ const vr g_ = (gin), v__ = (vin); \
    (beta1 * V_TANH(g_ * (1.0f / beta1)) * V_SIGMOID(g_)) * (beta2 * V_TANH(v__ * (1.0f / beta2))); })
#define BACKWARD(gin, vin, dyin, dg_out, dv_out) do { \
    const vr g_ = (gin), v__ = (vin), dy_ = (dyin); \
    const vr t1_ = V_TANH(g_ * (1.0f / beta1)), s_ = V_SIGMOID(g_), a_ = beta1 * t1_ * s_; \
    const vr t2_ = V_TANH(v__ * (1.0f / beta2)), b_ = beta2 * t2_; \
    str_(dg_out, dy_ * b_ * ((1.0f - t1_ * t1_) * s_ + a_ * (1.0f - s_))); \
    str_(dv_out, dy_ * a_ * (1.0f - t2_ * t2_)); } while (0)

CLONES void situ_glu_forward(const float *g, const float *v, float *y, int64_t n, float beta1, float beta2) {
    int64_t i = 0;
    for (; i + RW <= n; i += RW) str_(y + i, FORWARD(ldr(g + i), ldr(v + i)));
    if (i < n) {
        float gb[RW] = {0}, vb[RW] = {0}, yb[RW];
        memcpy(gb, g + i, (n - i) * sizeof(float));
        memcpy(vb, v + i, (n - i) * sizeof(float));
        str_(yb, FORWARD(ldr(gb), ldr(vb)));
        memcpy(y + i, yb, (n - i) * sizeof(float));
    }
}

CLONES void situ_glu_backward(const float *g, const float *v, const float *dy, float *dg, float *dv, int64_t n,
                              float beta1, float beta2) {
    int64_t i = 0;
    for (; i + RW <= n; i += RW) BACKWARD(ldr(g + i), ldr(v + i), ldr(dy + i), dg + i, dv + i);
    if (i < n) {
        float gb[RW] = {0}, vb[RW] = {0}, db[RW] = {0}, dgb[RW], dvb[RW];
        memcpy(gb, g + i, (n - i) * sizeof(float));
        memcpy(vb, v + i, (n - i) * sizeof(float));
        memcpy(db, dy + i, (n - i) * sizeof(float));
        BACKWARD(ldr(gb), ldr(vb), ldr(db), dgb, dvb);
        memcpy(dg + i, dgb, (n - i) * sizeof(float));
        memcpy(dv + i, dvb, (n - i) * sizeof(float));
    }
}
