/* SiTU-GLU forward and backward on the CPU, one pass over memory each (kernels/situ_glu/cpu.py).

       y  = a · b,   a = β1·t1·σ(g),   b = β2·t2,   t1 = tanh(g/β1),   t2 = tanh(v/β2)
       dg = dy · b · ((1 − t1²)·σ(g) + a·(1 − σ(g)))
       dv = dy · a · (1 − t2²)

   The backward recomputes t1, σ and t2 from g and v (two inputs saved instead of three
   intermediates). The tail of an array goes through the same vector code in a padded buffer
   (vecmath.h: an element's bits do not depend on where it sits). */

#include "../vecmath.h"

static inline vf forward_vf(vf g, vf v, float beta1, float beta2) {
    vf a = splat(beta1) * tanh_vf(g * splat(1.0f / beta1)) * sigmoid_vf(g);
    vf b = splat(beta2) * tanh_vf(v * splat(1.0f / beta2));
    return a * b;
}

static inline void backward_vf(vf g, vf v, vf dy, vf *dg, vf *dv, float beta1, float beta2) {
    vf t1 = tanh_vf(g * splat(1.0f / beta1));
    vf s = sigmoid_vf(g);
    vf a = splat(beta1) * t1 * s;
    vf t2 = tanh_vf(v * splat(1.0f / beta2));
    vf b = splat(beta2) * t2;
    *dg = dy * b * ((splat(1.0f) - t1 * t1) * s + a * (splat(1.0f) - s));
    *dv = dy * a * (splat(1.0f) - t2 * t2);
}

CLONES void situ_glu_forward(const float *g, const float *v, float *y, int64_t n, float beta1, float beta2) {
    int64_t i = 0;
    for (; i + W <= n; i += W)
        store(y + i, forward_vf(load(g + i), load(v + i), beta1, beta2));
    if (i < n) {
        float gb[W] = {0}, vb[W] = {0}, yb[W];
        memcpy(gb, g + i, (n - i) * sizeof(float));
        memcpy(vb, v + i, (n - i) * sizeof(float));
        store(yb, forward_vf(load(gb), load(vb), beta1, beta2));
        memcpy(y + i, yb, (n - i) * sizeof(float));
    }
}

CLONES void situ_glu_backward(const float *g, const float *v, const float *dy, float *dg, float *dv, int64_t n,
                              float beta1, float beta2) {
    int64_t i = 0;
    vf dgv, dvv;
    for (; i + W <= n; i += W) {
        backward_vf(load(g + i), load(v + i), load(dy + i), &dgv, &dvv, beta1, beta2);
        store(dg + i, dgv);
        store(dv + i, dvv);
    }
    if (i < n) {
        float gb[W] = {0}, vb[W] = {0}, db[W] = {0}, dgb[W], dvb[W];
        memcpy(gb, g + i, (n - i) * sizeof(float));
        memcpy(vb, v + i, (n - i) * sizeof(float));
        memcpy(db, dy + i, (n - i) * sizeof(float));
        backward_vf(load(gb), load(vb), load(db), &dgv, &dvv, beta1, beta2);
        store(dgb, dgv);
        store(dvb, dvv);
        memcpy(dg + i, dgb, (n - i) * sizeof(float));
        memcpy(dv + i, dvb, (n - i) * sizeof(float));
    }
}
