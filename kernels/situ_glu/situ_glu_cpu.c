/* SiTU-GLU forward and backward on the CPU, one pass over memory each (kernels/situ_glu/cpu.py
   builds and loads this file).

       y  = a · b,   a = β1·t1·σ(g),   b = β2·t2,   t1 = tanh(g/β1),   t2 = tanh(v/β2)
       dg = dy · b · ((1 − t1²)·σ(g) + a·(1 − σ(g)))
       dv = dy · a · (1 − t2²)

   The backward recomputes t1, σ and t2 from g and v (two inputs saved instead of three
   intermediates). tanh and exp are written out in + − × ÷ on GCC vector types of 8 floats, and the
   tail of an array goes through the same vector code in a padded buffer: every element gets the
   same IEEE operations wherever it sits, on every instruction set the clones pick (no fused
   multiply-adds, -ffp-contract=off), so a row's result never depends on its batch. */

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

#define W 8
typedef float vf __attribute__((vector_size(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W)));

static inline vf splat(float x) { return (vf){x, x, x, x, x, x, x, x}; }

/* mask ? a : b, on the bits (a comparison's mask is all ones or all zeros per lane) */
static inline vf select(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }

/* e^x, Cephes expf: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 in two parts, n·ln2 exact), e^r by a
   degree-6 polynomial, 2^n put into the exponent bits. About 1 ulp; x ≤ −88.38 gives 0 (2^−127
   has all-zero bits), x ≥ 88.38 gives +inf (exponent bits 255), NaN stays NaN (the clamps compare
   false and keep it). */
static inline vf exp_vf(vf x) {
    const vf hi = splat(88.3762626647949f), lo = splat(-88.3762626647949f);
    x = select(x > hi, hi, x);
    x = select(x < lo, lo, x);
    vf fx = x * splat(1.44269504088896341f) + splat(0.5f);
    vf t = __builtin_convertvector(__builtin_convertvector(fx, vi), vf);
    vf n = select(t > fx, t - splat(1.0f), t); /* floor */
    vf r = x - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    vf p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * (r * r) + r + splat(1.0f);
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)bits;
}

/* tanh x, Eigen's float rational approximation: x·P(x²)/Q(x²) of degrees 13/6 on x clamped to
   ±7.90531 (where tanh is within one float of ±1); x itself for |x| < 4e-4. */
static inline vf tanh_vf(vf x) {
    const vf clamp = splat(7.90531110763549805f);
    vf c = select(x > clamp, clamp, x);
    c = select(c < -clamp, -clamp, c);
    vf c2 = c * c;
    vf p = splat(-2.76076847742355e-16f);
    p = p * c2 + splat(2.00018790482477e-13f);
    p = p * c2 + splat(-8.60467152213735e-11f);
    p = p * c2 + splat(5.12229709037114e-08f);
    p = p * c2 + splat(1.48572235717979e-05f);
    p = p * c2 + splat(6.37261928875436e-04f);
    p = p * c2 + splat(4.89352455891786e-03f);
    p = p * c;
    vf q = splat(1.19825839466702e-06f);
    q = q * c2 + splat(1.18534705686654e-04f);
    q = q * c2 + splat(2.26843463243900e-03f);
    q = q * c2 + splat(4.89352518554385e-03f);
    vf ax = select(x < splat(0.0f), -x, x);
    return select(ax < splat(0.0004f), x, p / q);
}

static inline vf sigmoid_vf(vf x) { return splat(1.0f) / (splat(1.0f) + exp_vf(-x)); }

static inline vf load(const float *p) { vf x; memcpy(&x, p, sizeof x); return x; }
static inline void store(float *p, vf x) { memcpy(p, &x, sizeof x); }

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
