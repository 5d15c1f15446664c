/* Vector math for the CPU kernels (kernels/native.py builds the files that include this).

   tanh, exp and sigmoid written out in + − × ÷ on GCC vector types of W = 8 floats. Every lane gets
   the same IEEE operations whether it sits in a vector body or in a padded tail, on every
   instruction set the clones pick (no fused multiply-adds: -ffp-contract=off), so a kernel built on
   these gives an element the same bits wherever it sits: results never depend on the batch. */

#ifndef K3_VECMATH_H
#define K3_VECMATH_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

#define W 8  /* floats per vector */
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

#endif
