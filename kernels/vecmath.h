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

/* The same functions written once for any float vector type, as statement-expression macros: a
   kernel working on wider vectors (16 floats, one AVX-512 register) calls these in place, so they
   compile for the target_clones clone they sit in (GCC lowers a helper function's wide vectors for
   the default target before inlining it: kernels/kda/recurrent_cpu.c). A scalar operand of a vector
   operation is broadcast (GCC vector extensions); V_CONST makes a vector of x's type from a constant.
   The 8-float functions below are these macros, operation for operation. */
#define V_T(x) __typeof__((x) + 0.0f)
#define V_CONST(x, c) ((V_T(x)){} + (c))
/* mask ? a : b, on the bits (a comparison's mask is all ones or all zeros per lane) */
#define V_SELECT(m, a, b) ({ const __typeof__((m) + 0) m_ = (m); \
    (V_T(a))((m_ & (__typeof__(m_ + 0))(a)) | (~m_ & (__typeof__(m_ + 0))(b))); })

/* e^x, Cephes expf: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 in two parts, n·ln2 exact), e^r by a
   degree-6 polynomial, 2^n put into the exponent bits. About 1 ulp; x ≤ −88.38 gives 0 (2^−127
   has all-zero bits), x ≥ 88.38 gives +inf (exponent bits 255), NaN stays NaN (the clamps compare
   false and keep it). */
#define V_EXP(xin) ({ V_T(xin) x_ = (xin); typedef __typeof__((x_ > x_) + 0) I_; \
    x_ = V_SELECT(x_ > 88.3762626647949f, V_CONST(x_, 88.3762626647949f), x_); \
    x_ = V_SELECT(x_ < -88.3762626647949f, V_CONST(x_, -88.3762626647949f), x_); \
    const V_T(x_) fx_ = x_ * 1.44269504088896341f + 0.5f; \
    const V_T(x_) t_ = __builtin_convertvector(__builtin_convertvector(fx_, I_), V_T(x_)); \
    const V_T(x_) n_ = V_SELECT(t_ > fx_, t_ - 1.0f, t_); /* floor */ \
    V_T(x_) r_ = x_ - n_ * 0.693359375f; \
    r_ = r_ - n_ * -2.12194440e-4f; \
    V_T(x_) p_ = V_CONST(x_, 1.9875691500e-4f); \
    p_ = p_ * r_ + 1.3981999507e-3f; \
    p_ = p_ * r_ + 8.3334519073e-3f; \
    p_ = p_ * r_ + 4.1665795894e-2f; \
    p_ = p_ * r_ + 1.6666665459e-1f; \
    p_ = p_ * r_ + 5.0000001201e-1f; \
    p_ = p_ * (r_ * r_) + r_ + 1.0f; \
    const I_ bits_ = (__builtin_convertvector(n_, I_) + 127) << 23; \
    p_ * (V_T(x_))bits_; })

/* tanh x, Eigen's float rational approximation: x·P(x²)/Q(x²) of degrees 13/6 on x clamped to
   ±7.90531 (where tanh is within one float of ±1); x itself for |x| < 4e-4. */
#define V_TANH(xin) ({ const V_T(xin) x_ = (xin); \
    V_T(x_) c_ = V_SELECT(x_ > 7.90531110763549805f, V_CONST(x_, 7.90531110763549805f), x_); \
    c_ = V_SELECT(c_ < -7.90531110763549805f, V_CONST(x_, -7.90531110763549805f), c_); \
    const V_T(x_) c2_ = c_ * c_; \
    V_T(x_) p_ = V_CONST(x_, -2.76076847742355e-16f); \
    p_ = p_ * c2_ + 2.00018790482477e-13f; \
    p_ = p_ * c2_ + -8.60467152213735e-11f; \
    p_ = p_ * c2_ + 5.12229709037114e-08f; \
    p_ = p_ * c2_ + 1.48572235717979e-05f; \
    p_ = p_ * c2_ + 6.37261928875436e-04f; \
    p_ = p_ * c2_ + 4.89352455891786e-03f; \
    p_ = p_ * c_; \
    V_T(x_) q_ = V_CONST(x_, 1.19825839466702e-06f); \
    q_ = q_ * c2_ + 1.18534705686654e-04f; \
    q_ = q_ * c2_ + 2.26843463243900e-03f; \
    q_ = q_ * c2_ + 4.89352518554385e-03f; \
    const V_T(x_) ax_ = V_SELECT(x_ < 0.0f, -x_, x_); \
    V_SELECT(ax_ < 0.0004f, x_, p_ / q_); })

#define V_SIGMOID(xin) ({ const V_T(xin) s_x_ = (xin); 1.0f / (1.0f + V_EXP(-s_x_)); })

static inline vf exp_vf(vf x) { return V_EXP(x); }
static inline vf tanh_vf(vf x) { return V_TANH(x); }
static inline vf sigmoid_vf(vf x) { return V_SIGMOID(x); }

static inline vf load(const float *p) { vf x; memcpy(&x, p, sizeof x); return x; }
static inline void store(float *p, vf x) { memcpy(p, &x, sizeof x); }

#endif
