"""The MXFP4 decode GEMV (M <= GEMV_MAX_M): packed-fp16 block sums with the threads along the 32-blocks
of K, split-K; and its grouped form, one weight of a stack per row (a token's routed experts).

_mx_gemv_kernel: each thread loads the x of its blocks and makes their fp16 pairs once per step for
all its rows, and nothing crosses threads in the K loop (sm_90: 3.1-3.5 instructions per weight
value, no barrier); split-K fills the SMs and _splitk_reduce_kernel sums the fp32 partials [S, M, N]
in a fixed order (deterministic, unlike atomics). It is the fastest of the GEMV forms timed on the
H200 (7168^2 at M = 1 in 12.5-13.5 us, 2.5-2.7x bf16; a k3 token's 16 routed experts in one launch
2.7-2.8x bf16 torch.bmm); the others are in docs/log/mx.md.

Numerics. Per x block g of 32 values, p_g = floor(log2 max|x_g|) (clamped to [-113, 127]) and
x' = fp16(x * 2^(14 - p_g)), so max|x'| < 2^15 and no x' is Inf. The decoded weights are
w' = value * 2^-14 with |value| <= 6, so a product |w' x'| <= 24 and a half-block sum of 16 of them
<= 384: no fp16 intermediate can overflow (max 65504) whatever x is. x' is exact wherever
|x'| >= 2^-17 (bf16 has 8 significant bits, fp16 11); below that it may lose bits (x more than ~2^31
below its block's maximum). Per word the four products of each fp16 half are chained in fp16
(fma.rn, one rounding each), the block's four words are added as a tree (add.rn.f16x2), so each
product passes through at most 6 fp16 roundings; each rounding errs by at most u * |result| + 2^-25
(u = 2^-11; 2^-25 is half the fp16 subnormal step). The two halves are then exact in fp32, added, and
multiplied by 2^(p_g - 14) * 2^(E - 127) (exact barring fp32 under/overflow), and the blocks are summed
in fp32. Hence, for y = x @ W^T (x in bf16, W the dequantized weight):
    |y_n - y_exact_n| <= gamma_6 * sum_k |W_nk x_k| + 40 * 2^-25 * sum_g 2^p_g * 2^(E_ng - 127)
                         + (fp32 terms: gamma_(KB+64) at 2^-24, and underflow near 2^-136)
with gamma_j = j u / (1 - j u); gemv_error_bound computes it (the 40 covers the 38 underflowing fp16
roundings of a block and the x' conversion). gamma_6 = 2.9e-3, against 2^-8 = 3.9e-3 for rounding
the output to bf16; for random data the error is ~3e-4 relative. NaN in x propagates (x' is NaN
whatever p_g is); a NaN block scale (0xFF) makes its block NaN. The interpreter emulates the packed
ops in float64 and rounds once: there the sum a*b + c is exact (w' is a multiple of 2^-15, x' of
2^-24, the partial sums are below 2^10), so the emulation is the hardware's fma.rn. The kernel reads
x 16 bytes at a time: mx_gemv gives it x as is when K % 8 == 0 and the rows are 16-byte aligned (the
model's shapes), else a zero-padded copy, so that a load never crosses K.

Host time. An eager decode step calls this op dozens of times with the same weights: `gemv_decode`
and `gemv_grouped_decode` keep, per weight and call shape, the config, grid and the kernels compiled
for them (`CompiledLaunch`), so a call costs two allocations and one or two launches through the
compiled launcher, without the JIT's per-call argument binding (docs/log/mx.md has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.mx.triton import interpreter_enabled
from kernels.mx.triton.common import (
    CompiledLaunch, _check_operands, _e8m0_to_f32, _pow2, _reduce_splits, _sm_count, _split_plan, _splits_for,
    _splitk_reduce_kernel, _words,
)


@triton.jit
def _f16_lo(p):
    return p.to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def _f16_hi(p):
    return (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def _f16x2(lo, hi):
    """Two fp16 tensors -> int32 fp16 pairs (lo in bits 0-15, hi in bits 16-31)."""
    return lo.to(tl.uint16, bitcast=True).to(tl.int32) | (hi.to(tl.uint16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def _fma_f16x2(a, b, c, ASM: tl.constexpr):
    """a * b + c on int32 words holding fp16 pairs, each half rounded once (fma.rn.f16x2).

    The interpreter cannot run inline asm; there each half is computed in float64 and rounded
    once to fp16, which is the hardware's result wherever a * b + c is exact in float64: always
    in the f16x2 GEMV (module docstring, "Numerics")."""
    if ASM:
        return tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        lo = _f16_lo(a).to(tl.float64) * _f16_lo(b).to(tl.float64) + _f16_lo(c).to(tl.float64)
        hi = _f16_hi(a).to(tl.float64) * _f16_hi(b).to(tl.float64) + _f16_hi(c).to(tl.float64)
        return _f16x2(lo.to(tl.float16), hi.to(tl.float16))


@triton.jit
def _add_f16x2(a, b, ASM: tl.constexpr):
    """a + b on fp16 pairs (add.rn.f16x2; the emulation's float64 sum of two fp16 is exact)."""
    if ASM:
        return tl.inline_asm_elementwise("add.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        lo = _f16_lo(a).to(tl.float64) + _f16_lo(b).to(tl.float64)
        hi = _f16_hi(a).to(tl.float64) + _f16_hi(b).to(tl.float64)
        return _f16x2(lo.to(tl.float16), hi.to(tl.float16))


@triton.jit
def _pow2_wide(t):
    """2^t as float32 for int32 t in [-149, 127] (subnormal below -126)."""
    bits = tl.where(t >= -126, (tl.maximum(t, -126) + 127) << 23, 1 << (tl.minimum(t, -127) + 149))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _cvt_f16x2(lo, hi, ASM: tl.constexpr):
    """Two float32 tensors -> int32 fp16 pairs (lo in bits 0-15), each rounded to nearest even."""
    if ASM:
        # One instruction (F2FP.PACK_AB); the pair is made before x is shared between threads.
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        return _f16x2(lo.to(tl.float16), hi.to(tl.float16))


@triton.jit
def _e2m1_word_pairs(w, ASM: tl.constexpr = False):
    """int32 words of 8 E2M1 codes -> the fp16 pairs (value * 2^-14) of codes (0, 4), (1, 5),
    (2, 6), (3, 7), bit for bit those of _e2m1_words_to_f32, in 11 operations per word instead
    of 15: with a = the low nibbles in place and b = the high nibbles in place,
        p26 = ((a << 1) | (a << 4)) & M           p04 = (((a << 1) | (a << 4)) & (M >> 8)) << 8
        p37 = ((b >> 3) | b) & M                  p15 = (((b >> 3) | b) & (M >> 8)) << 8
    (M = 0x8E008E00; code 3's and code 7's signs already sit at bits 15 and 31 of b).
    ASM: the same as inline PTX whose lop3 fuses each (x | y) & M into one instruction, which
    ptxas does not find from Triton's separate or/and (sm_90 SASS: 13 -> 11 per word)."""
    if ASM:
        # lop3 LUT 0xA8 = (a | b) & c over the operand truth tables a = 0xF0, b = 0xCC, c = 0xAA.
        return tl.inline_asm_elementwise(
            "{ .reg .b32 a, b, a1, a4, b3, t, u; "
            "and.b32 a, $4, 0x0F0F0F0F; and.b32 b, $4, 0xF0F0F0F0; "
            "shl.b32 a1, a, 1; shl.b32 a4, a, 4; shr.u32 b3, b, 3; "
            "lop3.b32 t, a1, a4, 0x008E008E, 0xA8; shl.b32 $0, t, 8; "
            "lop3.b32 u, b3, b, 0x008E008E, 0xA8; shl.b32 $1, u, 8; "
            "lop3.b32 $2, a1, a4, 0x8E008E00, 0xA8; "
            "lop3.b32 $3, b3, b, 0x8E008E00, 0xA8; }",
            "=r,=r,=r,=r,r", [w], dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    m = -0x71FF7200  # 0x8E008E00 as an int32
    a = w & 0x0F0F0F0F
    b = w & -0x0F0F0F10  # 0xF0F0F0F0
    a14 = (a << 1) | (a << 4)
    b3 = (b >> 3) | b
    return (a14 & 0x008E008E) << 8, (b3 & 0x008E008E) << 8, a14 & m, b3 & m


@triton.jit
def _gemv_block_sums_f16x2(words, e, x0, x1, x2, x3, xfac, ASM: tl.constexpr):
    """[R, G] block dot products (codes x x) times their block scales, accumulated in fp16 pairs.

    Per word (8 codes): four chained packed FMAs over the code pairs (0, 4), (1, 5), (2, 6),
    (3, 7); the block's four words are then added as a tree, (w0 + w1) + (w2 + w3); the two fp16
    halves go to float32 and are added, then scaled by 2^(p - 14) and the E8M0 scale."""
    p04, p15, p26, p37 = _e2m1_word_pairs(words, ASM)
    h = _fma_f16x2(p04, x0[None, :, :], tl.zeros_like(words), ASM)
    h = _fma_f16x2(p15, x1[None, :, :], h, ASM)
    h = _fma_f16x2(p26, x2[None, :, :], h, ASM)
    h = _fma_f16x2(p37, x3[None, :, :], h, ASM)
    h_even, h_odd = tl.split(tl.reshape(h, [h.shape[0], h.shape[1], 2, 2]))  # words (0, 2), (1, 3)
    s01, s23 = tl.split(_add_f16x2(h_even, h_odd, ASM))  # w0 + w1, w2 + w3
    s = _add_f16x2(s01, s23, ASM)
    part = _f16_lo(s).to(tl.float32) + _f16_hi(s).to(tl.float32)
    return (part * xfac[None, :]) * _e8m0_to_f32(e.to(tl.int32))


@triton.jit
def _ld_x_word(ptr, ok, ASM: tl.constexpr):
    """The 16 bytes (8 bf16) at ptr, as 4 int32 bf16 pairs (0 where not ok), in ptr's layout.

    Inline asm because tl.load would get its own layout from Triton's coalescing pass (one value
    per thread along the strided word axis) and a shared-memory conversion into the weight words'
    layout every iteration; the asm op takes its operands' layout, so each thread loads the x it
    needs (an L1 hit: x is a few KB). ld.global.nc: x is read-only during the kernel. ptr must be
    16-byte aligned (mx_gemv checks). The interpreter (ASM = False) loads the 4 words with tl.load."""
    if ASM:
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $5, 0; mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; "
            "mov.b32 $3, 0; @p ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4]; }",
            "=r,=r,=r,=r,l,r", [ptr, ok.to(tl.int32)], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1)
    else:
        p32 = ptr.to(tl.pointer_type(tl.int32), bitcast=True)
        return (tl.load(p32, mask=ok, other=0), tl.load(p32 + 1, mask=ok, other=0),
                tl.load(p32 + 2, mask=ok, other=0), tl.load(p32 + 3, mask=ok, other=0))


@triton.jit
def _ld_scale(ptr, ok, ASM: tl.constexpr):
    """E8M0 code at ptr as int32 (127 where not ok), in ptr's layout (inline asm: see _ld_x_word)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b32 $0, 127; @p ld.global.nc.u8 $0, [$1]; }",
            "=r,l,r", [ptr, ok.to(tl.int32)], dtype=tl.int32, is_pure=True, pack=1)
    else:
        return tl.load(ptr, mask=ok, other=127).to(tl.int32)


@triton.jit
def _bf16_lo(p):
    return (p << 16).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_hi(p):
    return (p & -0x10000).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_load_lanes(q_rows, s_rows, n_ok, kb0, kb, g_ok, step_ok, KB, GROUPS: tl.constexpr,
                     ASM: tl.constexpr):
    """The weight words and scale bytes of one K step for _mx_gemv_kernel (kb = kb0 + arange(GROUPS); g_ok the blocks to
    load, step_ok False for a prefetch past the program's last step): the words are loaded
    as one row-contiguous [R, GROUPS * 4] tile (q_rows [R, 1]), so that Triton's coalescing gives
    each thread the 16 bytes of one block and puts the threads along the blocks, the rows inside
    the threads; the scale bytes are loaded in that layout by _ld_scale."""
    kw = kb0 * 4 + tl.arange(0, GROUPS * 4)
    words = tl.load(q_rows + kw[None, :], mask=n_ok[:, None] & ((kw < KB * 4) & step_ok)[None, :], other=0)
    words = tl.reshape(words, [words.shape[0], GROUPS, 4])
    e = _ld_scale(s_rows + kb[None, :], n_ok[:, None] & g_ok[None, :], ASM)
    return words, e


@triton.jit
def _x_word_f32(x_row, kb, g_ok, K, I: tl.constexpr, ASM: tl.constexpr):
    """The 8 x values of word I of the blocks kb (elements 32 kb + 8 I + j) as float32 [G] tensors."""
    k0 = kb * 32 + I * 8
    t0, t1, t2, t3 = _ld_x_word(x_row + k0, g_ok & (k0 < K), ASM)
    return (_bf16_lo(t0), _bf16_hi(t0), _bf16_lo(t1), _bf16_hi(t1),
            _bf16_lo(t2), _bf16_hi(t2), _bf16_lo(t3), _bf16_hi(t3))


@triton.jit
def _absmax8(v0, v1, v2, v3, v4, v5, v6, v7):
    return tl.maximum(tl.maximum(tl.maximum(tl.abs(v0), tl.abs(v1)), tl.maximum(tl.abs(v2), tl.abs(v3))),
                      tl.maximum(tl.maximum(tl.abs(v4), tl.abs(v5)), tl.maximum(tl.abs(v6), tl.abs(v7))))


@triton.jit
def _x_word_pairs(v0, v1, v2, v3, v4, v5, v6, v7, f, ASM: tl.constexpr):
    """x' = x * f of one word as the fp16 pairs of the code pairs (0, 4), (1, 5), (2, 6), (3, 7)."""
    return (_cvt_f16x2(v0 * f, v4 * f, ASM), _cvt_f16x2(v1 * f, v5 * f, ASM),
            _cvt_f16x2(v2 * f, v6 * f, ASM), _cvt_f16x2(v3 * f, v7 * f, ASM))


@triton.jit
def _join4(a, b, c, d):
    """Four [G] tensors -> [G, 4] with column i the i-th (held by one thread)."""
    return tl.reshape(tl.join(tl.join(a, c), tl.join(b, d)), [a.shape[0], 4])


@triton.jit
def _gemv_x_pairs_in_thread(x_row, kb, g_ok, K, ASM: tl.constexpr):
    """x[32 kb + j] for the GROUPS blocks kb -> fp16 pairs [G, 4] in the order of the decoded code pairs,
    and each block's factor xfac [G] = 2^(p - 14), made by each thread from the x of the blocks it holds (four 16-byte loads per block, _ld_x_word),
    with elementwise operations only, so nothing is exchanged between threads. p is clamped to
    [-113, 127] instead of [-126, 127] so that 2^(14 - p) is one fp32 multiply (a block whose
    largest |x| is below 2^-113 gets max |x'| < 2^14; gemv_error_bound uses the same clamp)."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _x_word_f32(x_row, kb, g_ok, K, 0, ASM)
    b0, b1, b2, b3, b4, b5, b6, b7 = _x_word_f32(x_row, kb, g_ok, K, 1, ASM)
    c0, c1, c2, c3, c4, c5, c6, c7 = _x_word_f32(x_row, kb, g_ok, K, 2, ASM)
    d0, d1, d2, d3, d4, d5, d6, d7 = _x_word_f32(x_row, kb, g_ok, K, 3, ASM)
    # tl.maximum need not propagate NaN; a NaN x is carried by x' itself whatever p is.
    amax = tl.maximum(tl.maximum(_absmax8(a0, a1, a2, a3, a4, a5, a6, a7), _absmax8(b0, b1, b2, b3, b4, b5, b6, b7)),
                      tl.maximum(_absmax8(c0, c1, c2, c3, c4, c5, c6, c7), _absmax8(d0, d1, d2, d3, d4, d5, d6, d7)))
    p = tl.minimum(tl.maximum(((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -113), 127)
    f = _pow2(14 - p)
    a04, a15, a26, a37 = _x_word_pairs(a0, a1, a2, a3, a4, a5, a6, a7, f, ASM)
    b04, b15, b26, b37 = _x_word_pairs(b0, b1, b2, b3, b4, b5, b6, b7, f, ASM)
    c04, c15, c26, c37 = _x_word_pairs(c0, c1, c2, c3, c4, c5, c6, c7, f, ASM)
    d04, d15, d26, d37 = _x_word_pairs(d0, d1, d2, d3, d4, d5, d6, d7, f, ASM)
    return (_join4(a04, b04, c04, d04), _join4(a15, b15, c15, d15), _join4(a26, b26, c26, d26),
            _join4(a37, b37, c37, d37), _pow2_wide(p - 14))


@triton.jit
def _gemv_epilogue(ya, yb, offs_a, offs_b, a_ok, b_ok, pid_m, pid_s, bias_ptr, y_ptr, p_ptr,
                   stride_ym, stride_ps, stride_pm, HAS_BIAS: tl.constexpr, SPLITS: tl.constexpr):
    """Writes one program's fp32 sums ya, yb (rows offs_a, offs_b of x row pid_m, split pid_s): with one
    split y = sums (+ bias) in y's dtype, else the partial to p[pid_s, pid_m, :] for _splitk_reduce_kernel."""
    if SPLITS == 1:
        if HAS_BIAS:
            ya += tl.load(bias_ptr + offs_a, mask=a_ok, other=0.0).to(tl.float32)
            yb += tl.load(bias_ptr + offs_b, mask=b_ok, other=0.0).to(tl.float32)
        base = y_ptr + pid_m.to(tl.int64) * stride_ym
        tl.store(base + offs_a, ya.to(y_ptr.dtype.element_ty), mask=a_ok)
        tl.store(base + offs_b, yb.to(y_ptr.dtype.element_ty), mask=b_ok)
    else:
        base = p_ptr + pid_m.to(tl.int64) * stride_pm + pid_s.to(tl.int64) * stride_ps
        tl.store(base + offs_a, ya, mask=a_ok)
        tl.store(base + offs_b, yb, mask=b_ok)


@triton.jit
def _mx_gemv_kernel(
    x_ptr, q_ptr, s_ptr, bias_ptr, y_ptr, p_ptr, ids_ptr,
    N, K, KB, KB_PER_SPLIT, NUM_E,
    stride_xm, stride_qn, stride_sn, stride_ym, stride_ps, stride_pm, stride_qe, stride_se,
    ITERS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, PREFETCH: tl.constexpr, ASM: tl.constexpr,
    GROUPED: tl.constexpr,
):
    """One program per (BLOCK_N rows of W, row of x, K split): the threads lie along the blocks and
    hold rows, each makes the x' of its own blocks once per step for all its rows
    (_gemv_x_pairs_in_thread), and the block sums are packed-fp16 (_gemv_block_sums_f16x2).
    q_ptr: the packed codes as int32 words [N, Kp / 8] (stride_qn in words). ASM = False runs the
    packed ops and loads in plain Triton (the interpreter).

    GROUPED (mx_gemv_grouped): row m of x and y goes with its own weight, number ids[m] of a stack of
    NUM_E weights [E, N, K] (codes and scales strided by stride_qe / stride_se along E); a row whose id
    is outside [0, NUM_E) reads expert 0 and writes NaN (no host synchronisation checks the ids)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    HALF: tl.constexpr = BLOCK_N // 2
    if GROUPED:
        expert = tl.load(ids_ptr + pid_m).to(tl.int64)
        valid = (expert >= 0) & (expert < NUM_E)
        expert = tl.where(valid, expert, 0)
        q_ptr += expert * stride_qe
        s_ptr += expert * stride_se
    offs_a = pid_n * BLOCK_N + tl.arange(0, HALF)
    offs_b = offs_a + HALF
    a_ok = offs_a < N
    b_ok = offs_b < N
    g = tl.arange(0, GROUPS)
    kb_lo = pid_s * KB_PER_SPLIT

    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
    qa = q_ptr + offs_a.to(tl.int64)[:, None] * stride_qn
    qb = q_ptr + offs_b.to(tl.int64)[:, None] * stride_qn
    sa = s_ptr + offs_a.to(tl.int64)[:, None] * stride_sn
    sb = s_ptr + offs_b.to(tl.int64)[:, None] * stride_sn
    acc_a = tl.zeros([HALF, GROUPS], dtype=tl.float32)
    acc_b = tl.zeros([HALF, GROUPS], dtype=tl.float32)
    if PREFETCH:
        kb = kb_lo + g
        wa, ea = _gemv_load_lanes(qa, sa, a_ok, kb_lo, kb, kb < KB, True, KB, GROUPS, ASM)
        wb, eb = _gemv_load_lanes(qb, sb, b_ok, kb_lo, kb, kb < KB, True, KB, GROUPS, ASM)
    for it in range(0, ITERS):
        kb0 = kb_lo + it * GROUPS
        kb = kb0 + g
        g_ok = kb < KB
        x0, x1, x2, x3, xfac = _gemv_x_pairs_in_thread(x_row, kb, g_ok, K, ASM)
        if PREFETCH:
            kn = kb + GROUPS
            n_ok = (kn < KB) & (it + 1 < ITERS)
            wa_n, ea_n = _gemv_load_lanes(qa, sa, a_ok, kb0 + GROUPS, kn, n_ok, it + 1 < ITERS, KB, GROUPS, ASM)
            wb_n, eb_n = _gemv_load_lanes(qb, sb, b_ok, kb0 + GROUPS, kn, n_ok, it + 1 < ITERS, KB, GROUPS, ASM)
            acc_a += _gemv_block_sums_f16x2(wa, ea, x0, x1, x2, x3, xfac, ASM)
            acc_b += _gemv_block_sums_f16x2(wb, eb, x0, x1, x2, x3, xfac, ASM)
            wa, ea, wb, eb = wa_n, ea_n, wb_n, eb_n
        else:
            wa, ea = _gemv_load_lanes(qa, sa, a_ok, kb0, kb, g_ok, True, KB, GROUPS, ASM)
            wb, eb = _gemv_load_lanes(qb, sb, b_ok, kb0, kb, g_ok, True, KB, GROUPS, ASM)
            acc_a += _gemv_block_sums_f16x2(wa, ea, x0, x1, x2, x3, xfac, ASM)
            acc_b += _gemv_block_sums_f16x2(wb, eb, x0, x1, x2, x3, xfac, ASM)
    ya = tl.sum(acc_a, axis=1) * 16384.0
    yb = tl.sum(acc_b, axis=1) * 16384.0
    if GROUPED:
        ya = tl.where(valid, ya, float("nan"))
        yb = tl.where(valid, yb, float("nan"))
    _gemv_epilogue(ya, yb, offs_a, offs_b, a_ok, b_ok, pid_m, pid_s, bias_ptr, y_ptr, p_ptr,
                   stride_ym, stride_ps, stride_pm, HAS_BIAS, SPLITS)


@dataclass(frozen=True)
class GemvConfig:
    """A tile of _mx_gemv_kernel; `default_gemv_config` / `default_grouped_gemv_config` choose one per
    shape. The defaults here are the k3 expert tile (16 rows over 4 warps, 128 blocks per step)."""

    block_n: int = 16
    groups: int = 128     # 32-blocks of K per loop iteration (GROUPS * 16 bytes of codes per row)
    split_k: int = 1      # programs along K (rounded so each holds a multiple of `groups` blocks)
    num_warps: int = 4
    prefetch: bool = False  # load the next step's weights before this step's arithmetic


def default_gemv_config(n: int, k: int, device: torch.device) -> GemvConfig:
    """The fastest M = 1 tiles measured on the H200 (docs/log/mx.md): large weights 64 rows per program
    over 8 warps, 32 blocks per step, register prefetch (7168^2: 12.5-13.5 us, 2.5-2.7x bf16);
    expert-sized ones 16 rows over 4 warps, 128 blocks per step, the whole K of the k3 experts, so one
    program per row tile (3584 -> 3072: 5.3 us, 2.0x); split K for about 7 programs per SM."""
    if n * k >= 1 << 25:
        cfg = GemvConfig(block_n=64, groups=32, num_warps=8, prefetch=True)
    else:
        cfg = GemvConfig(block_n=16, groups=128, num_warps=4)
    split = _splits_for(-(-n // cfg.block_n), k, cfg.groups, 7, _sm_count(device))
    return GemvConfig(cfg.block_n, cfg.groups, split, cfg.num_warps, cfg.prefetch)


def default_grouped_gemv_config(n: int, k: int, rows: int, device: torch.device) -> GemvConfig:
    """The tile for `rows` (weight, x row) pairs of [n, k] weights, measured on the H200 for a k3
    decode token's 16 routed experts (docs/log/mx.md; benchmarks/kernels/mx_grouped.py): steps of 16 blocks
    when they divide K's blocks (3584 -> 7 steps, 3072 -> 6), so no lane idles, 128 or 64 rows per
    program over 4 warps, whichever spreads the programs more evenly over the SMs (ties: 128), no split
    (rows x row tiles programs already fill the GPU). Otherwise default_gemv_config's."""
    kb = -(-k // 32)
    if kb % 16:
        return default_gemv_config(n, k, device)
    sms = _sm_count(device)

    def imbalance(block_n: int) -> float:  # busiest SM's programs over the mean
        programs = -(-n // block_n) * rows
        return -(-programs // sms) / (programs / sms)

    block_n = min((128, 64), key=lambda b: (round(imbalance(b), 3), -b))
    return GemvConfig(block_n=block_n, groups=16, split_k=1, num_warps=4)


def _x_for_word_loads(x: torch.Tensor) -> torch.Tensor:
    """x itself when every row starts 16-byte aligned and K is a multiple of 8 (the kernel's 16-byte x
    loads then never cross K); else a zero-padded copy [M, K rounded up to 8] (never the case for the
    model's K). A stride-0 expand of one row stays one: every program row reads row 0."""
    m, k = x.shape
    if x.stride(0) == 0 and m > 1:
        return _x_for_word_loads(x[:1]).expand(m, -1)
    if k % 8 == 0 and x.data_ptr() % 16 == 0 and (m == 1 or x.stride(0) % 8 == 0):
        return x
    kp = -(-k // 8) * 8
    xp = torch.zeros((m, kp), device=x.device, dtype=x.dtype)
    xp[:, :k] = x
    return xp[:, :k]


def _check_grouped(x, codes, scales, ids) -> None:
    if codes.dim() != 3 or scales.dim() != 3 or codes.shape[:2] != scales.shape[:2]:
        raise ValueError(f"grouped weights: codes [E, N, Kp/2] and scales [E, N, Kp/32] with the same E, N; "
                         f"got {tuple(codes.shape)} and {tuple(scales.shape)}")
    if ids.dim() != 1 or ids.shape[0] != x.shape[0] or ids.dtype != torch.int32 or ids.device != x.device:
        raise ValueError(f"ids: int32 [G] on x's device with G = x.shape[0] = {x.shape[0]}; "
                         f"got {ids.dtype} {tuple(ids.shape)} on {ids.device}")
    if ids.device.type == "cpu" and ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < codes.shape[0]):
        raise ValueError(f"ids must lie in [0, {codes.shape[0]})")


def mx_gemv(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, k: int, bias: torch.Tensor | None,
            out: torch.Tensor, cfg: GemvConfig) -> torch.Tensor:
    """out[M, N] = x[M, K] (bf16) @ W^T for MXFP4 W given as packed codes [N, Kp/2] and scales [N, Kp/32]."""
    _check_operands(x, codes, scales, k, out)
    return _launch_gemv(x, codes, scales, k, bias, out, cfg)


def mx_gemv_grouped(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor, k: int,
                    out: torch.Tensor, cfg: GemvConfig | None = None) -> torch.Tensor:
    """out[j] = x[j] @ W[ids[j]]^T for a stack of MXFP4 weights (codes [E, N, Kp/2], scales [E, N, Kp/32]),
    in one launch: the decode step of a mixture of experts, where one token's rows go through its
    routed experts (x [G, K] bf16, one row per routed expert, or a stride-0 expand of one row; ids [G]
    int32; out [G, N]). cfg None is default_grouped_gemv_config's. ids on the CPU are range-checked
    (ValueError); on the GPU a row with an id outside [0, E) comes out NaN."""
    _check_grouped(x, codes, scales, ids)
    if cfg is None:
        cfg = default_grouped_gemv_config(codes.shape[1], k, x.shape[0], x.device)
    _check_operands(x[:1] if x.stride(0) == 0 else x, codes[0], scales[0], k, out[:1] if x.stride(0) == 0 else out)
    return _launch_gemv(x, codes, scales, k, None, out, cfg, ids)


def _gemv_args(x, words, scales, bias, out, partial, ids, k, cfg: GemvConfig):
    """_mx_gemv_kernel's grid, arguments in signature order and launch options."""
    m, n, kb = x.shape[0], words.shape[-2], scales.shape[-1]
    per, splits = _split_plan(kb, cfg.groups, cfg.split_k)
    grid = (triton.cdiv(n, cfg.block_n), m, splits)
    grouped = ids is not None
    args = (x, words, scales, bias if bias is not None else scales, out, partial, ids if grouped else scales,
            n, k, kb, per, words.shape[0] if grouped else 1,
            x.stride(0), words.stride(-2), scales.stride(-2), out.stride(0), partial.stride(0), partial.stride(-2),
            words.stride(0) if grouped else 0, scales.stride(0) if grouped else 0,
            per // cfg.groups, bias is not None, splits, cfg.block_n, cfg.groups, cfg.prefetch,
            not interpreter_enabled(), grouped)
    return grid, args, dict(num_warps=cfg.num_warps)


def _launch_gemv(x, codes, scales, k, bias, out, cfg: GemvConfig, ids: torch.Tensor | None = None) -> torch.Tensor:
    """The GEMV launch(es) behind mx_gemv and mx_gemv_grouped (ids: one weight of the stack per row)."""
    x = _x_for_word_loads(x)
    m, n, kb = x.shape[0], codes.shape[-2], scales.shape[-1]
    splits = _split_plan(kb, cfg.groups, cfg.split_k)[1]
    partial = torch.empty((splits, m, n), device=x.device, dtype=torch.float32) if splits > 1 else out
    grid, args, meta = _gemv_args(x, _words(codes), scales, bias, out, partial, ids, k, cfg)
    _mx_gemv_kernel[grid](*args, **meta)
    if splits > 1:
        _reduce_splits(partial, bias, out)
    return out


# ---- cached launches for the eager decode path (module docstring, "Host time") --------------------
class _Plan:
    """One call shape of gemv_decode / gemv_grouped_decode: the grid, the compiled kernels and the
    arguments that do not change between calls (the weight's pointers as ints, sizes, constexprs)."""

    __slots__ = ("n", "splits", "gemv", "pre", "mid", "tail", "reduce", "reduce_tail")


_PLANS: dict[tuple, _Plan] = {}


def _plan(key, x, codes, scales, bias, out, partial, ids, k, cfg) -> _Plan:
    """Runs the call through the JIT (which compiles it) and keeps what later calls need."""
    plan = _Plan()
    words = _words(codes)
    grid, args, meta = _gemv_args(x, words, scales, bias, out, partial, ids, k, cfg)
    plan.gemv = CompiledLaunch(_mx_gemv_kernel, grid, args, meta)
    ptrs = tuple(a.data_ptr() for a in args[:7])
    # Per call: x (0), out (4), partial (5), ids (6); the rest is fixed by the key.
    plan.pre, plan.mid, plan.tail = ptrs[1:4], args[7:], None
    plan.n, plan.splits = out.shape[1], partial.shape[0] if partial is not out else 1
    plan.reduce = None
    if plan.splits > 1:
        m = out.shape[0]
        rargs = (partial, bias if bias is not None else partial, out, plan.n, partial.stride(0), partial.stride(1),
                 out.stride(0), plan.splits, bias is not None, 256)
        plan.reduce = CompiledLaunch(_splitk_reduce_kernel, (triton.cdiv(plan.n, 256), m, 1), rargs, {})
        plan.reduce_tail = (bias.data_ptr() if bias is not None else None,) + rargs[3:]
    _PLANS[key] = plan
    return plan


def _run_plan(plan: _Plan, x, out, ids, stream: int) -> None:
    if plan.splits == 1:
        plan.gemv(stream, (x.data_ptr(),) + plan.pre + (out.data_ptr(), out.data_ptr(), ids) + plan.mid)
        return
    partial = torch.empty((plan.splits, out.shape[0], plan.n), device=out.device, dtype=torch.float32)
    pp = partial.data_ptr()
    plan.gemv(stream, (x.data_ptr(),) + plan.pre + (out.data_ptr(), pp, ids) + plan.mid)
    bp = plan.reduce_tail[0]
    plan.reduce(stream, (pp, pp if bp is None else bp, out.data_ptr()) + plan.reduce_tail[1:])


def gemv_decode(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, k: int, bias: torch.Tensor | None,
                out_dtype: torch.dtype) -> torch.Tensor:
    """mx_gemv with default_gemv_config on CUDA tensors (x [M, K] bf16 with unit K stride, checked by the
    caller), its launches cached per weight and call shape (module docstring, "Host time")."""
    x = _x_for_word_loads(x)
    m, n = x.shape[0], codes.shape[0]
    dev = x.get_device()
    # Everything the JIT specialises on: the weight's and bias's addresses (so their alignment and the
    # strides with them), the shape, x's row stride and alignment, the output dtype, the device.
    key = (codes.data_ptr(), scales.data_ptr(), n, k, codes.stride(0), scales.stride(0), m, x.stride(0),
           x.data_ptr() % 16 == 0, bias.data_ptr() if bias is not None else 0,
           bias.dtype if bias is not None else None, out_dtype, dev)
    out = torch.empty((m, n), device=x.device, dtype=out_dtype)
    plan = _PLANS.get(key)
    if plan is None:
        cfg = default_gemv_config(n, k, x.device)
        splits = _split_plan(scales.shape[-1], cfg.groups, cfg.split_k)[1]
        partial = torch.empty((splits, m, n), device=x.device, dtype=torch.float32) if splits > 1 else out
        _plan(key, x, codes, scales, bias, out, partial, None, k, cfg)  # compiles and runs the call
        return out
    # The plan keeps the scales pointer as the ids argument (unused when not grouped).
    _run_plan(plan, x, out, plan.pre[1], torch._C._cuda_getCurrentRawStream(dev))
    return out


def gemv_grouped_decode(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor, k: int,
                        out_dtype: torch.dtype) -> torch.Tensor:
    """mx_gemv_grouped with default_grouped_gemv_config on CUDA tensors, cached like gemv_decode
    (ids int32 [G] on x's device, checked by the caller; rows with ids outside [0, E) come out NaN)."""
    x = _x_for_word_loads(x)
    g, n = x.shape[0], codes.shape[1]
    dev = x.get_device()
    key = (codes.data_ptr(), scales.data_ptr(), codes.shape, k, codes.stride(0), codes.stride(1), scales.stride(0),
           scales.stride(1), g, x.stride(0), x.data_ptr() % 16 == 0, ids.data_ptr() % 16 == 0, out_dtype, dev)
    out = torch.empty((g, n), device=x.device, dtype=out_dtype)
    plan = _PLANS.get(key)
    if plan is None:
        cfg = default_grouped_gemv_config(n, k, g, x.device)
        splits = _split_plan(scales.shape[-1], cfg.groups, cfg.split_k)[1]
        partial = torch.empty((splits, g, n), device=x.device, dtype=torch.float32) if splits > 1 else out
        _plan(key, x, codes, scales, None, out, partial, ids, k, cfg)  # compiles and runs the call
        return out
    _run_plan(plan, x, out, ids.data_ptr(), torch._C._cuda_getCurrentRawStream(dev))
    return out


def gemv_error_bound(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Bound [M, N] (float64) on |mx_gemv(x, ...) - y_exact| from the module docstring's "Numerics";
    y_exact = x.double() @ w.T (+ bias), w = the dequantized weight [N, K] (float64), scales the E8M0
    codes [N, KB], x [M, K] in bf16 (for the x blocks' exponents p_g)."""
    m, k = x.shape
    n, kb = scales.shape
    xd = torch.nn.functional.pad(x.double(), (0, kb * 32 - k))
    wd = torch.nn.functional.pad(w.double(), (0, kb * 32 - k))
    abs_sum = xd.abs() @ wd.abs().T  # [M, N]: sum_k |W_nk x_k|
    y = xd @ wd.T
    if bias is not None:
        y = y + bias.double()

    def gamma(j: int, u: float) -> float:
        return j * u / (1 - j * u)

    u16, u32 = 2.0**-11, 2.0**-24
    # Every block's fp32 terms: the half-sum, the scale products, ITERS + GROUPS + splits additions,
    # the bias, at most KB + 64 roundings for any config.
    g32 = gamma(kb + 64, u32)
    e = scales.long()
    # fp32 underflow: each of the <= 2 * KB + 64 roundings below 2^-126 in the accumulator's units
    # (y * 2^-14) errs by at most 2^-150, i.e. 2^-136 in y's, times the block scale where that exceeds 1.
    big_scale = torch.exp2((e - 127).clamp(min=0).double()).amax(dim=1)  # [N]
    under32 = (2 * kb + 96) * 2.0**-136 * big_scale[None, :].expand(m, n)
    amax = xd.abs().reshape(m, kb, 32).amax(dim=2)
    p = torch.floor(torch.log2(amax.clamp(min=2.0**-126))).clamp(-113, 127)  # the kernel's clamp
    block = torch.exp2(p)[:, None, :] * torch.exp2((e - 127).double())[None, :, :]  # [M, N, KB]
    under16 = 40 * 2.0**-25 * block.sum(dim=2)
    g6 = gamma(6, u16)
    bound = g6 * abs_sum + under16 + g32 * (1 + g6) * abs_sum + under32
    if bias is not None:
        bound = bound + u32 * (y.abs() + bound)
    if out_dtype != torch.float32:
        bound = bound + torch.finfo(out_dtype).eps / 2 * (y.abs() + bound)
    return bound
