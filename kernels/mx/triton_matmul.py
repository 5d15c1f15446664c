"""Triton kernels: MXFP4-weight matmul (weights decoded in-kernel), MXFP4 -> bf16 dequant, fused fake-quant.

    y[m, n] = sum_k x'[m, k] * W[n, k] (+ bias[n]),   W[n, k] = P[n, k] * 2^(E[n, k // 32] - 127)

W is an MXTensor in fp4_e2m1 [N, K] (blocks of 32 along K, two codes per byte, low nibble first),
read by the kernels as int32 words of 8 codes; x' is x rounded to bf16, or its MXFP8 (E4M3)
fake-quantization made by _fake_quant_kernel (Hopper has no MX tensor-core instructions, so MXFP8
activations enter the dot as their exact bf16 values).

Decoding (_e2m1_words_to_f32): an E2M1 code c read as fp16 bits (c & 7) << 9 | (c & 8) << 12 is
exactly value(c) * 2^-14 (E2M1's subnormal 0.5 lands on fp16's subnormal 2^-15). Two codes are
placed per 32-bit operation: for the low nibbles a of a word, ((a << 9) | (a << 12)) & 0x8E008E00
is an fp16 pair holding codes 0 and 4 (inside the mask the two shifts never overlap), and so on.
On sm_90 this is about 5.7 instructions per weight value in the GEMV loop, down from 9.6 with one
code per operation (docs/log/mx.md); the packed-fp16 kernels run it as inline PTX whose lop3
fuses each or-and pair (_e2m1_word_pairs). The 2^14 is applied once per output. The E8M0 scale is built
from its bits: fp32 bits E << 23 is 2^(E-127); E = 0 and 0xFF get mantissa 0x400000 (2^-127, NaN).

Kernels (benchmarks/mx.py measures them; docs/log/mx.md has the figures):
- _mx_gemv_elem_f16x2_kernel (decode, M <= GEMV_MAX_M; the default, default_gemv_config;
  GemvConfig(accumulate="f16x2", loop="elementwise")): the packed-fp16 block sums of
  _mx_gemv_f16x2_kernel (same numerics, "Numerics" below) with the threads along the 32-blocks of K
  and the rows inside each thread: each thread loads the x of its blocks and makes their fp16 pairs
  once per step for all its rows, and nothing crosses threads in the K loop (sm_90: 3.1-3.5
  instructions per weight value, no barrier; 7168^2 at M = 1 in 12.5-13.5 us on the H200, 2.5-2.7x
  bf16). Split-K and the reductions as below. With GROUPED (mx_gemv_grouped) each row of x has its
  own weight from a stack, the decode step of a mixture of experts in one launch (a k3 token's 16
  routed experts: 2.7-2.8x bf16 torch.bmm, default_grouped_gemv_config; benchmarks/mx_grouped.py).
- _mx_gemv_kernel (GemvConfig(accumulate="f32"), the default until 2026-11-29): CUDA cores; one
  program per (BLOCK_N rows of W, row of x, K split); each 32-block's dot product is summed before its scale is applied; two row
  halves share each converted x value; the next step's weights are loaded before this step's
  arithmetic; split-K fills the SMs (a 1 x 7168 x 7168 product runs as ~1600 programs) and
  _splitk_reduce_kernel sums the fp32 partials [S, M, N] in a fixed order (deterministic, unlike
  atomics). With GemvConfig(reduce="in_kernel") there is no second launch: each program writes its
  partial and bumps a per-(tile, row) counter (atomic, acq_rel), and the program that arrives last
  sums the partials in the same fixed order and writes the output (_gemv_epilogue; same bits).
- _mx_gemv_f16x2_kernel (GemvConfig(accumulate="f16x2", loop="block_sums")): the GEMV with each
  32-block's products accumulated in packed fp16 (fma.rn.f16x2 on the decoded code pairs) instead of
  one fp16 -> fp32 conversion and one FFMA per value; "Numerics" below. On sm_90 (AOT-compiled, SASS
  counted; docs/log/mx.md) its loop takes 4.4 instructions per weight value at BLOCK_N = 32 and 3.9
  at BLOCK_N = 64, against 5.9 / 5.5 for the fp32 kernel.
- _mx_gemv_elem_kernel (GemvConfig(loop="elementwise"); not a default): the fp32 GEMV without
  cross-thread work in the K loop. _mx_gemv_kernel's per-block tl.sum and its broadcast of an x tile
  [G, 32] over the rows make Triton convert layouts through shared memory every iteration (sm_90 SASS
  at the default tile: 5 BAR.SYNC, STSM/STS/LDS in the loop; docs/log/mx.md). Here each thread
  keeps, per weight word it loads, an fp32 accumulator in the words' own layout [rows, G, 4]: the
  word's 8 products are summed in a chain, times the block scale, added to it; x is loaded per
  thread, 16 bytes per word, by inline asm (a tl.load would get its own layout from the coalescing
  pass and a conversion back), as is the scale byte; the tree over G * 4 and the rows' halves runs
  once after the loop. The loop has no barrier and no shared-memory instruction (0 at BLOCK_N 32/64,
  GROUPS 4/8, 4/8 warps; tests/kernels/mx/test_gemv_elementwise_sass.py) and 5.9 instructions per
  weight value at the default tile (block_sums: 5.9), at 89 registers instead of 62.
- _mx_gemm_kernel (GEMV_MAX_M < M <= GEMM_MAX_M): acc[BLOCK_N, BLOCK_M] = W_tile @ x_tile^T on
  the tensor cores ("swap AB": the decoded weight is the register operand, the small M is the
  dot's N), split-K as above.
- _mx_dequant_kernel: W to bf16 in one pass (exact), for prefill, where cuBLAS's bf16 GEMM then
  beats any fused kernel here.

Numerics of accumulate="f16x2". Per x block g of 32 values, p_g = floor(log2 max|x_g|) (clamped
to [-126, 127]) and x' = fp16(x * 2^(14 - p_g)), so max|x'| < 2^15 and no x' is Inf. The decoded
weights are w' = value * 2^-14 with |value| <= 6, so a product |w' x'| <= 24 and a half-block sum of 16
of them <= 384: no fp16 intermediate can overflow (max 65504) whatever x is. x' is exact wherever
|x'| >= 2^-17 (bf16 has 8 significant bits, fp16 11); below that it may lose bits (x more than ~2^31
below its block's maximum). Per word the four products of each fp16 half are chained in fp16
(fma.rn, one rounding each), the block's four words are added as a tree (add.rn.f16x2), so each
product passes through at most 6 fp16 roundings; each rounding errs by at most u * |result| + 2^-25
(u = 2^-11; 2^-25 is half the fp16 subnormal step). The two halves are then exact in fp32, added, and
multiplied by 2^(p_g - 14) * 2^(E - 127) (exact barring fp32 under/overflow), and the blocks are summed
in fp32 as in the default kernel. Hence, for y = x @ W^T (x in bf16, W the dequantized weight):
    |y_n - y_exact_n| <= gamma_6 * sum_k |W_nk x_k| + 40 * 2^-25 * sum_g 2^p_g * 2^(E_ng - 127)
                         + (fp32 terms: gamma_(KB+64) at 2^-24, and underflow near 2^-136)
with gamma_j = j u / (1 - j u); gemv_error_bound computes it (the 40 covers the 38 underflowing fp16
roundings of a block and the x' conversion). gamma_6 = 2.9e-3, against 2^-8 = 3.9e-3 for rounding
the output to bf16; for random data the error is ~3e-4 relative. NaN in x propagates (x' is NaN whatever p_g is); a
NaN block scale (0xFF) makes its block NaN as in the default kernel. The interpreter emulates the
packed ops in float64 and rounds once: there the sum a*b + c is exact (w' is a multiple of 2^-15, x'
of 2^-24, the partial sums are below 2^10: every value is a multiple of 2^-39 below 2^10), so the
emulation is the hardware's fma.rn.

Numerics of loop="elementwise" (accumulate="f32"). The decoded w' = value * 2^-14 and x (bf16) give
exact fp32 products (2 + 8 significant bits) unless they underflow, and the block scale 2^(E - 127)
multiplies exactly unless the result under- or overflows. Per weight word, t = the chain of its 8
products (7 roundings); acc[r, g, i] += t * scale (1 rounding: the product is exact), ITERS times; after
the loop a tree over the GROUPS * 4 accumulators of a row (any order, depth <= 4 GROUPS - 1), the exact
2^14, then the S - 1 split additions (and the bias). So every product passes through at most
7 + ITERS + 4 GROUPS + S <= 2 KB + 4 GROUPS + 8 = d roundings, each relative u = 2^-24 in the normal
range, and
    |y_n - y_exact_n| <= gamma_d * sum_k |W_nk x_k| + (1 + gamma_d) * U,
with U the underflow term: every fp32 rounding below 2^-126 errs by at most 2^-150 in the
accumulator's units (2^-136 in y's), the 15 roundings per word before the scale multiplied by the scale
where it exceeds 1: U <= (70 KB + 4 GROUPS + 8) * 2^-136 * max(1, max_g 2^(E_ng - 127)).
gemv_error_bound(..., loop="elementwise", groups=G) computes it; gamma_d is ~1e-5 at KB = 224, a true
bound for any ITERS and S, not a tuned tolerance. NaN in x or a NaN scale (0xFF) propagates to the
row's outputs as in block_sums (t * NaN). mx_gemv gives the kernel x as is when K % 8 == 0 and the
rows are 16-byte aligned (the model's shapes), else a zero-padded copy, so that a 16-byte x load never
crosses K.

Under TRITON_INTERPRET=1 (the CPU tests) the dot runs in fp32: the interpreter multiplies bf16
operands as raw uint16 integers. The decoded weights and the activations are exact in bf16, so
only the accumulation order differs from the GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch

from .formats import SCALE_ROUNDINGS, get_format

try:
    import triton
    import triton.language as tl
except ImportError:  # the library must import with torch alone (DESIGN.md §7)
    triton = None
    tl = None


def triton_available() -> bool:
    return triton is not None


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


if triton is not None:

    @triton.jit
    def _e8m0_to_f32(e):
        """E8M0 code (int32, 0..255) -> 2^(e-127) as float32 (2^-127 subnormal for 0, NaN for 255)."""
        edge = (e == 0) | (e == 255)
        return ((e << 23) | tl.where(edge, 0x400000, 0)).to(tl.float32, bitcast=True)

    @triton.jit
    def _pow2(e):
        """2^e as float32 for int32 e in [-126, 127]."""
        return ((e + 127) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def _fake_quant_kernel(
        x_ptr, y_ptr, R, K, stride_xr, stride_yr,
        BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr,
        EMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr, MAXV: tl.constexpr,
        MAX_MANT: tl.constexpr, CEIL: tl.constexpr,
    ):
        """y = dequant(quant(x)) per block of BS along K, non-finite results replaced by x."""
        offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = (offs_r[:, None] < R) & (offs_k[None, :] < K)
        rows = offs_r.to(tl.int64)[:, None]
        x_in = tl.load(x_ptr + rows * stride_xr + offs_k[None, :], mask=mask, other=0.0)
        x = tl.reshape(x_in.to(tl.float32), [BLOCK_R, BLOCK_K // BS, BS])

        a = tl.abs(x)
        # NaN and Inf are caught explicitly: tl.max need not propagate NaN.
        bad = tl.max(((a != a) | (a > 3.4028234663852886e38)).to(tl.int32), axis=2) > 0
        amax = tl.where(bad, 0.0, tl.max(a, axis=2))
        bits = amax.to(tl.int32, bitcast=True)
        s = ((bits >> 23) & 0xFF) - 127 - EMAX
        if CEIL:
            s += ((bits & 0x7FFFFF) > MAX_MANT).to(tl.int32)
        s = tl.minimum(tl.maximum(s, -127), 127)

        y = x * _pow2(-s)[:, :, None]
        ay = tl.minimum(tl.abs(y), MAXV)
        # Round |y| to the element grid, ties to even: the grid step is 2^(max(e, EMIN) - MBITS),
        # and adding then subtracting 1.5 * 2^(23 + log2 step) rounds to a multiple of it (RNE).
        e = tl.maximum(((ay.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, EMIN)
        magic = (((e - MBITS + 23 + 127) << 23) | 0x400000).to(tl.float32, bitcast=True)
        q = (ay + magic) - magic
        sign = (y.to(tl.int32, bitcast=True) >> 31) << 31
        q = (q.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
        dq = q * _e8m0_to_f32(s + 127)[:, :, None]
        # A block holding NaN or Inf dequantizes to NaN (E8M0 0xFF); QAT keeps x there instead.
        dq = tl.reshape(tl.where(bad[:, :, None], x, dq), [BLOCK_R, BLOCK_K])

        out = dq.to(y_ptr.dtype.element_ty)
        # Values that overflow the output dtype (fp16 near its max) also fall back to x.
        finite = tl.abs(out.to(tl.float32)) <= 3.4028234663852886e38
        out = tl.where(finite, out, x_in.to(y_ptr.dtype.element_ty))
        tl.store(y_ptr + rows * stride_yr + offs_k[None, :], out, mask=mask)

    @triton.jit
    def _join8(t0, t1, t2, t3, t4, t5, t6, t7):
        """Nested joins: element (c1, c2, c3) of the result is t[c1 + 2*c2 + 4*c3], so the flattened
        position p = 4*c1 + 2*c2 + c3 holds t[bitreverse3(p)]."""
        return tl.join(tl.join(tl.join(t0, t1), tl.join(t2, t3)), tl.join(tl.join(t4, t5), tl.join(t6, t7)))

    @triton.jit
    def _fp16_pair_lo(p):
        return p.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _fp16_pair_hi(p):
        return (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _e2m1_words_to_f32(w):
        """int32 words [R, G, 4], each holding 8 E2M1 codes (code j of word i is element 8i + j,
        nibble j counted from the least significant), -> float32 values * 2^-14, [R, G, 32].

        Two codes are decoded per 32-bit operation: with a = the low nibbles of the 4 bytes, the
        fp16 magnitude of a code belongs at bits 9-11 and its sign at bit 15, so
            ((a << 9) | (a << 12)) & 0x8E008E00
        is an fp16 pair holding codes 0 and 4 (the two shifts never overlap inside the mask), and
        shifts of 1 and 4 give codes 2 and 6; the high nibbles give codes 1, 5 and 3, 7.
        """
        mask = -0x71FF7200  # 0x8E008E00 as an int32: sign bits 15 and 31, magnitudes at 9-11 and 25-27
        a = w & 0x0F0F0F0F
        b = (w >> 4) & 0x0F0F0F0F
        p04 = ((a << 9) | (a << 12)) & mask
        p26 = ((a << 1) | (a << 4)) & mask
        p15 = ((b << 9) | (b << 12)) & mask
        p37 = ((b << 1) | (b << 4)) & mask
        # Passed in the order of codes 0, 4, 2, 6, 1, 5, 3, 7 (bit-reversed), _join8 lays them out in order.
        v = _join8(_fp16_pair_lo(p04), _fp16_pair_hi(p04), _fp16_pair_lo(p26), _fp16_pair_hi(p26),
                   _fp16_pair_lo(p15), _fp16_pair_hi(p15), _fp16_pair_lo(p37), _fp16_pair_hi(p37))
        return tl.reshape(v, [w.shape[0], w.shape[1], 32])

    @triton.jit
    def _gemv_load(q_rows, s_rows, n_ok, kb, g_ok, w4):
        words = tl.load(q_rows + kb[None, :, None] * 4 + w4[None, None, :],
                        mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
        e = tl.load(s_rows + kb[None, :], mask=n_ok[:, None] & g_ok[None, :], other=127)
        return words, e

    @triton.jit
    def _gemv_block_sums(words, e, xv):
        """[R, G] block dot products (codes x x) times their block scales."""
        part = tl.sum(_e2m1_words_to_f32(words) * xv[None, :, :], axis=2)
        return part * _e8m0_to_f32(e.to(tl.int32))

    @triton.jit
    def _gemv_epilogue(ya, yb, offs_a, offs_b, a_ok, b_ok, pid_n, pid_m, pid_s, bias_ptr, y_ptr, p_ptr, cnt_ptr,
                       stride_ym, stride_ps, stride_pm,
                       HAS_BIAS: tl.constexpr, SPLITS: tl.constexpr, REDUCE: tl.constexpr):
        """Writes one GEMV program's fp32 sums ya, yb (rows offs_a, offs_b of x row pid_m, split pid_s).

        REDUCE = 0 (one split): y = sums (+ bias) in y's dtype. REDUCE = 1: the partial goes to
        p[pid_s, pid_m, :] and _splitk_reduce_kernel sums later. REDUCE = 2 (reduce="in_kernel"): the
        partial goes to p, then the program counts itself in cnt[pid_m, pid_n]; the one that finds
        SPLITS - 1 earlier arrivals sums p[0..SPLITS-1] in split order (its own slot from registers,
        the same bits), adds the bias, writes y and resets the counter to 0 for the next launch.
        The sum order is that of _splitk_reduce_kernel whichever program arrives last, so both
        reductions give the same bits.

        Ordering (PTX memory model, the pattern of CUTLASS's split-K semaphore): every thread's
        partial stores -> bar.sync (tl.debug_barrier; the atomic is issued by one thread) -> atom
        .acq_rel.gpu, a release that covers what the barrier ordered before it (release is
        cumulative). In the last program the same atomic acquires the other programs' releases, and
        Triton's broadcast of its result (shared memory + bar.sync) orders every thread's loads after
        it; the loads also bypass L1 (.cg), which is not coherent between SMs. Triton 3.6 would put a
        bar.sync before the atomic anyway (its result's shared-memory slot was the stores' layout
        scratch); the explicit barrier keeps that from being an accident and adds none to the PTX.
        tests/kernels/mx/test_gemv_in_kernel_ptx.py checks this order in the sm_90 PTX.
        """
        if REDUCE == 0:
            if HAS_BIAS:
                ya += tl.load(bias_ptr + offs_a, mask=a_ok, other=0.0).to(tl.float32)
                yb += tl.load(bias_ptr + offs_b, mask=b_ok, other=0.0).to(tl.float32)
            base = y_ptr + pid_m.to(tl.int64) * stride_ym
            tl.store(base + offs_a, ya.to(y_ptr.dtype.element_ty), mask=a_ok)
            tl.store(base + offs_b, yb.to(y_ptr.dtype.element_ty), mask=b_ok)
        else:
            p_row = p_ptr + pid_m.to(tl.int64) * stride_pm
            base = p_row + pid_s.to(tl.int64) * stride_ps
            tl.store(base + offs_a, ya, mask=a_ok)
            tl.store(base + offs_b, yb, mask=b_ok)
            if REDUCE == 2:
                tl.debug_barrier()
                cnt = cnt_ptr + pid_m * tl.num_programs(0) + pid_n
                arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
                if arrived == SPLITS - 1:
                    acc_a = tl.zeros_like(ya)
                    acc_b = tl.zeros_like(yb)
                    for s in range(0, SPLITS):
                        other = s != pid_s
                        pa = tl.load(p_row + s * stride_ps + offs_a, mask=a_ok & other, other=0.0,
                                     cache_modifier=".cg")
                        pb = tl.load(p_row + s * stride_ps + offs_b, mask=b_ok & other, other=0.0,
                                     cache_modifier=".cg")
                        acc_a += tl.where(other, pa, ya)
                        acc_b += tl.where(other, pb, yb)
                    if HAS_BIAS:
                        acc_a += tl.load(bias_ptr + offs_a, mask=a_ok, other=0.0).to(tl.float32)
                        acc_b += tl.load(bias_ptr + offs_b, mask=b_ok, other=0.0).to(tl.float32)
                    out = y_ptr + pid_m.to(tl.int64) * stride_ym
                    tl.store(out + offs_a, acc_a.to(y_ptr.dtype.element_ty), mask=a_ok)
                    tl.store(out + offs_b, acc_b.to(y_ptr.dtype.element_ty), mask=b_ok)
                    # Every program of this tile has counted (the count reached SPLITS), so nothing
                    # else touches the counter in this launch; the next launch reads the 0.
                    tl.store(cnt, 0)

    @triton.jit
    def _mx_gemv_kernel(
        x_ptr, q_ptr, s_ptr, bias_ptr, y_ptr, p_ptr, cnt_ptr,
        N, K, KB, KB_PER_SPLIT,
        stride_xm, stride_qn, stride_sn, stride_ym, stride_ps, stride_pm,
        ITERS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLITS: tl.constexpr, REDUCE: tl.constexpr,
        BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, PREFETCH: tl.constexpr,
    ):
        """q_ptr: the packed codes as int32 words [N, Kp / 8] (stride_qn in words).
        PREFETCH issues the next step's weight loads before this step's arithmetic (more bytes in
        flight per thread, more registers)."""
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_s = tl.program_id(2)
        # Two row halves share every converted x value (one bf16 -> fp32 conversion feeds 2 rows).
        HALF: tl.constexpr = BLOCK_N // 2
        offs_a = pid_n * BLOCK_N + tl.arange(0, HALF)
        offs_b = offs_a + HALF
        a_ok = offs_a < N
        b_ok = offs_b < N
        g = tl.arange(0, GROUPS)
        w4 = tl.arange(0, 4)
        j32 = tl.arange(0, 32)
        kb_lo = pid_s * KB_PER_SPLIT

        x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
        qa = q_ptr + offs_a.to(tl.int64)[:, None, None] * stride_qn
        qb = q_ptr + offs_b.to(tl.int64)[:, None, None] * stride_qn
        sa = s_ptr + offs_a.to(tl.int64)[:, None] * stride_sn
        sb = s_ptr + offs_b.to(tl.int64)[:, None] * stride_sn
        acc_a = tl.zeros([HALF, GROUPS], dtype=tl.float32)
        acc_b = tl.zeros([HALF, GROUPS], dtype=tl.float32)
        # The last split may hold fewer blocks: those past KB are masked.
        if PREFETCH:
            kb = kb_lo + g
            wa, ea = _gemv_load(qa, sa, a_ok, kb, kb < KB, w4)
            wb, eb = _gemv_load(qb, sb, b_ok, kb, kb < KB, w4)
        for it in range(0, ITERS):
            kb = kb_lo + it * GROUPS + g
            g_ok = kb < KB
            k = kb[:, None] * 32 + j32[None, :]
            xv = tl.load(x_row + k, mask=g_ok[:, None] & (k < K), other=0.0).to(tl.float32)  # [G, 32]
            if PREFETCH:
                kn = kb + GROUPS
                n_ok = (kn < KB) & (it + 1 < ITERS)
                wa_n, ea_n = _gemv_load(qa, sa, a_ok, kn, n_ok, w4)
                wb_n, eb_n = _gemv_load(qb, sb, b_ok, kn, n_ok, w4)
                acc_a += _gemv_block_sums(wa, ea, xv)
                acc_b += _gemv_block_sums(wb, eb, xv)
                wa, ea, wb, eb = wa_n, ea_n, wb_n, eb_n
            else:
                wa, ea = _gemv_load(qa, sa, a_ok, kb, g_ok, w4)
                wb, eb = _gemv_load(qb, sb, b_ok, kb, g_ok, w4)
                acc_a += _gemv_block_sums(wa, ea, xv)
                acc_b += _gemv_block_sums(wb, eb, xv)
        ya = tl.sum(acc_a, axis=1) * 16384.0
        yb = tl.sum(acc_b, axis=1) * 16384.0
        _gemv_epilogue(ya, yb, offs_a, offs_b, a_ok, b_ok, pid_n, pid_m, pid_s, bias_ptr, y_ptr, p_ptr, cnt_ptr,
                       stride_ym, stride_ps, stride_pm, HAS_BIAS, SPLITS, REDUCE)

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
    def _gemv_x_pairs(x_row, kb, g_ok, K, GROUPS: tl.constexpr, ASM: tl.constexpr):
        """x[32 kb + j] for the GROUPS blocks kb -> fp16 pairs in the order of the decoded code pairs,
        and each block's factor 2^(p - 14).

        Block g is scaled by 2^(14 - p) with p = floor(log2 max|x|) (clamped to [-126, 127]), so its
        largest |x'| lies in [2^14, 2^15) and rounds to a finite fp16. Returns x0, x1, x2, x3 [G, 4]:
        x_c[g, i] holds x' at elements 8i + c (low half) and 8i + c + 4 (high half), the pairing of
        the code pairs p04, p15, p26, p37 of word i; and xfac [G] = 2^(p - 14) as float32."""
        j32 = tl.arange(0, 32)
        k = kb[:, None] * 32 + j32[None, :]
        xv = tl.load(x_row + k, mask=g_ok[:, None] & (k < K), other=0.0).to(tl.float32)  # [G, 32]
        # tl.max need not propagate NaN; a NaN x is carried by x' itself whatever p is.
        amax = tl.max(tl.abs(xv), axis=1)
        p = tl.minimum(tl.maximum(((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -126), 127)
        # 2^(14 - p) spans 2^-113 .. 2^140: two exact power-of-two multiplies, each within _pow2's range.
        s = 14 - p
        xs = (xv * _pow2(s >> 1)[:, None]) * _pow2(s - (s >> 1))[:, None]
        # Element 8i + 4t + c of the block -> [G, i, c, t]; split t into the low and high halves.
        lo, hi = tl.split(tl.permute(tl.reshape(xs, [GROUPS, 4, 2, 4]), (0, 1, 3, 2)))
        pairs = tl.reshape(_cvt_f16x2(lo, hi, ASM), [GROUPS, 4, 2, 2])  # [G, i, c // 2, c % 2]
        even, odd = tl.split(pairs)
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
        return x0, x1, x2, x3, _pow2_wide(p - 14)

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
    def _gemv_load_lanes(q_rows, s_rows, n_ok, kb0, kb, g_ok, step_ok, KB, GROUPS: tl.constexpr,
                         ASM: tl.constexpr):
        """_gemv_load for _mx_gemv_elem_f16x2_kernel (kb = kb0 + arange(GROUPS); g_ok the blocks to
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
        """_gemv_x_pairs for _mx_gemv_elem_f16x2_kernel: the same x' pairs [G, 4] and xfac [G], made
        by each thread from the x of the blocks it holds (four 16-byte loads per block, _ld_x_word),
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
    def _mx_gemv_elem_f16x2_kernel(
        x_ptr, q_ptr, s_ptr, bias_ptr, y_ptr, p_ptr, cnt_ptr, ids_ptr,
        N, K, KB, KB_PER_SPLIT,
        stride_xm, stride_qn, stride_sn, stride_ym, stride_ps, stride_pm, stride_qe, stride_se,
        ITERS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLITS: tl.constexpr, REDUCE: tl.constexpr,
        BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, PREFETCH: tl.constexpr, ASM: tl.constexpr,
        GROUPED: tl.constexpr = False,
    ):
        """_mx_gemv_f16x2_kernel without exchanges between threads in the K loop (loop="elementwise"):
        the threads lie along the blocks and hold rows, each makes the x' of its own blocks once per
        step for all its rows (_gemv_x_pairs_in_thread), and the block sums are those of
        _gemv_block_sums_f16x2 (the same numerics).

        GROUPED (mx_gemv_grouped): row m of x and y goes with its own weight, number ids[m] of a stack
        of weights [E, N, K] (codes and scales strided by stride_qe / stride_se along E)."""
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_s = tl.program_id(2)
        HALF: tl.constexpr = BLOCK_N // 2
        if GROUPED:
            expert = tl.load(ids_ptr + pid_m).to(tl.int64)
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
        _gemv_epilogue(ya, yb, offs_a, offs_b, a_ok, b_ok, pid_n, pid_m, pid_s, bias_ptr, y_ptr, p_ptr, cnt_ptr,
                       stride_ym, stride_ps, stride_pm, HAS_BIAS, SPLITS, REDUCE)

    @triton.jit
    def _mx_gemv_f16x2_kernel(
        x_ptr, q_ptr, s_ptr, bias_ptr, y_ptr, p_ptr, cnt_ptr,
        N, K, KB, KB_PER_SPLIT,
        stride_xm, stride_qn, stride_sn, stride_ym, stride_ps, stride_pm,
        ITERS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLITS: tl.constexpr, REDUCE: tl.constexpr,
        BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, PREFETCH: tl.constexpr, ASM: tl.constexpr,
    ):
        """_mx_gemv_kernel with each 32-block's dot product accumulated in packed fp16 (accumulate =
        "f16x2"); ASM = False runs the packed ops in plain Triton (the interpreter)."""
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_s = tl.program_id(2)
        HALF: tl.constexpr = BLOCK_N // 2
        offs_a = pid_n * BLOCK_N + tl.arange(0, HALF)
        offs_b = offs_a + HALF
        a_ok = offs_a < N
        b_ok = offs_b < N
        g = tl.arange(0, GROUPS)
        w4 = tl.arange(0, 4)
        kb_lo = pid_s * KB_PER_SPLIT

        x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
        qa = q_ptr + offs_a.to(tl.int64)[:, None, None] * stride_qn
        qb = q_ptr + offs_b.to(tl.int64)[:, None, None] * stride_qn
        sa = s_ptr + offs_a.to(tl.int64)[:, None] * stride_sn
        sb = s_ptr + offs_b.to(tl.int64)[:, None] * stride_sn
        acc_a = tl.zeros([HALF, GROUPS], dtype=tl.float32)
        acc_b = tl.zeros([HALF, GROUPS], dtype=tl.float32)
        if PREFETCH:
            kb = kb_lo + g
            wa, ea = _gemv_load(qa, sa, a_ok, kb, kb < KB, w4)
            wb, eb = _gemv_load(qb, sb, b_ok, kb, kb < KB, w4)
        for it in range(0, ITERS):
            kb = kb_lo + it * GROUPS + g
            g_ok = kb < KB
            x0, x1, x2, x3, xfac = _gemv_x_pairs(x_row, kb, g_ok, K, GROUPS, ASM)
            if PREFETCH:
                kn = kb + GROUPS
                n_ok = (kn < KB) & (it + 1 < ITERS)
                wa_n, ea_n = _gemv_load(qa, sa, a_ok, kn, n_ok, w4)
                wb_n, eb_n = _gemv_load(qb, sb, b_ok, kn, n_ok, w4)
                acc_a += _gemv_block_sums_f16x2(wa, ea, x0, x1, x2, x3, xfac, ASM)
                acc_b += _gemv_block_sums_f16x2(wb, eb, x0, x1, x2, x3, xfac, ASM)
                wa, ea, wb, eb = wa_n, ea_n, wb_n, eb_n
            else:
                wa, ea = _gemv_load(qa, sa, a_ok, kb, g_ok, w4)
                wb, eb = _gemv_load(qb, sb, b_ok, kb, g_ok, w4)
                acc_a += _gemv_block_sums_f16x2(wa, ea, x0, x1, x2, x3, xfac, ASM)
                acc_b += _gemv_block_sums_f16x2(wb, eb, x0, x1, x2, x3, xfac, ASM)
        ya = tl.sum(acc_a, axis=1) * 16384.0
        yb = tl.sum(acc_b, axis=1) * 16384.0
        _gemv_epilogue(ya, yb, offs_a, offs_b, a_ok, b_ok, pid_n, pid_m, pid_s, bias_ptr, y_ptr, p_ptr, cnt_ptr,
                       stride_ym, stride_ps, stride_pm, HAS_BIAS, SPLITS, REDUCE)

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
    def _gemv_elem_load(q_rows, s_rows, n_ok, kb, g_ok, w4, ASM: tl.constexpr):
        words = tl.load(q_rows + kb[None, :, None] * 4 + w4[None, None, :],
                        mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
        e = _ld_scale(s_rows + kb[None, :], n_ok[:, None] & g_ok[None, :], ASM)
        return words, e

    @triton.jit
    def _bf16_lo(p):
        return (p << 16).to(tl.float32, bitcast=True)

    @triton.jit
    def _bf16_hi(p):
        return (p & -0x10000).to(tl.float32, bitcast=True)

    @triton.jit
    def _gemv_elem_step(acc, words, e, x0, x1, x2, x3):
        """acc [R, G, 4] += (the word's 8 products, summed in a chain) * block scale, all in the weight
        words' layout. x_t holds x at elements 8i + 2t (low) and 8i + 2t + 1 (high) of word i; the code
        pairs are (0, 4), (1, 5), (2, 6), (3, 7)."""
        p04, p15, p26, p37 = _e2m1_word_pairs(words)
        t = _fp16_pair_lo(p04) * _bf16_lo(x0)
        t += _fp16_pair_lo(p15) * _bf16_hi(x0)
        t += _fp16_pair_lo(p26) * _bf16_lo(x1)
        t += _fp16_pair_lo(p37) * _bf16_hi(x1)
        t += _fp16_pair_hi(p04) * _bf16_lo(x2)
        t += _fp16_pair_hi(p15) * _bf16_hi(x2)
        t += _fp16_pair_hi(p26) * _bf16_lo(x3)
        t += _fp16_pair_hi(p37) * _bf16_hi(x3)
        return acc + t * _e8m0_to_f32(e)[:, :, None]

    @triton.jit
    def _mx_gemv_elem_kernel(
        x_ptr, q_ptr, s_ptr, bias_ptr, y_ptr, p_ptr, cnt_ptr,
        N, K, KB, KB_PER_SPLIT,
        stride_xm, stride_qn, stride_sn, stride_ym, stride_ps, stride_pm,
        ITERS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLITS: tl.constexpr, REDUCE: tl.constexpr,
        BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, PREFETCH: tl.constexpr, ASM: tl.constexpr,
    ):
        """_mx_gemv_kernel with loop="elementwise": no layout conversion inside the K loop."""
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_s = tl.program_id(2)
        HALF: tl.constexpr = BLOCK_N // 2
        offs_a = pid_n * BLOCK_N + tl.arange(0, HALF)
        offs_b = offs_a + HALF
        a_ok = offs_a < N
        b_ok = offs_b < N
        g = tl.arange(0, GROUPS)
        w4 = tl.arange(0, 4)
        kb_lo = pid_s * KB_PER_SPLIT

        x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
        qa = q_ptr + offs_a.to(tl.int64)[:, None, None] * stride_qn
        qb = q_ptr + offs_b.to(tl.int64)[:, None, None] * stride_qn
        sa = s_ptr + offs_a.to(tl.int64)[:, None] * stride_sn
        sb = s_ptr + offs_b.to(tl.int64)[:, None] * stride_sn
        acc_a = tl.zeros([HALF, GROUPS, 4], dtype=tl.float32)
        acc_b = tl.zeros([HALF, GROUPS, 4], dtype=tl.float32)
        if PREFETCH:
            kb = kb_lo + g
            wa, ea = _gemv_elem_load(qa, sa, a_ok, kb, kb < KB, w4, ASM)
            wb, eb = _gemv_elem_load(qb, sb, b_ok, kb, kb < KB, w4, ASM)
        for it in range(0, ITERS):
            kb = kb_lo + it * GROUPS + g
            g_ok = kb < KB
            xw = tl.broadcast_to((kb[:, None] * 32 + w4[None, :] * 8)[None, :, :], [HALF, GROUPS, 4])
            x_ok = tl.broadcast_to(g_ok[None, :, None], [HALF, GROUPS, 4]) & (xw < K)
            x0, x1, x2, x3 = _ld_x_word(x_row + xw, x_ok, ASM)
            if PREFETCH:
                kn = kb + GROUPS
                n_ok = (kn < KB) & (it + 1 < ITERS)
                wa_n, ea_n = _gemv_elem_load(qa, sa, a_ok, kn, n_ok, w4, ASM)
                wb_n, eb_n = _gemv_elem_load(qb, sb, b_ok, kn, n_ok, w4, ASM)
                acc_a = _gemv_elem_step(acc_a, wa, ea, x0, x1, x2, x3)
                acc_b = _gemv_elem_step(acc_b, wb, eb, x0, x1, x2, x3)
                wa, ea, wb, eb = wa_n, ea_n, wb_n, eb_n
            else:
                wa, ea = _gemv_elem_load(qa, sa, a_ok, kb, g_ok, w4, ASM)
                wb, eb = _gemv_elem_load(qb, sb, b_ok, kb, g_ok, w4, ASM)
                acc_a = _gemv_elem_step(acc_a, wa, ea, x0, x1, x2, x3)
                acc_b = _gemv_elem_step(acc_b, wb, eb, x0, x1, x2, x3)
        ya = tl.sum(tl.sum(acc_a, axis=2), axis=1) * 16384.0
        yb = tl.sum(tl.sum(acc_b, axis=2), axis=1) * 16384.0
        _gemv_epilogue(ya, yb, offs_a, offs_b, a_ok, b_ok, pid_n, pid_m, pid_s, bias_ptr, y_ptr, p_ptr, cnt_ptr,
                       stride_ym, stride_ps, stride_pm, HAS_BIAS, SPLITS, REDUCE)

    @triton.jit
    def _mx_gemm_kernel(
        x_ptr, q_ptr, s_ptr, bias_ptr, y_ptr,
        M, N, K, KB, KB_PER_SPLIT,
        stride_xm, stride_qn, stride_sn, stride_ym, stride_ys,
        ITERS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, DOT_DTYPE: tl.constexpr,
    ):
        """q_ptr: the packed codes as int32 words [N, Kp / 8] (stride_qn in words)."""
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_s = tl.program_id(2)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        n_ok = offs_n < N
        m_ok = offs_m < M
        g = tl.arange(0, GROUPS)
        w4 = tl.arange(0, 4)
        kk = tl.arange(0, GROUPS * 32)
        kb_lo = pid_s * KB_PER_SPLIT

        x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
        q_rows = q_ptr + offs_n.to(tl.int64)[:, None, None] * stride_qn
        s_rows = s_ptr + offs_n.to(tl.int64)[:, None] * stride_sn
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for it in range(0, ITERS):
            kb0 = kb_lo + it * GROUPS
            kb = kb0 + g
            g_ok = kb < KB
            words = tl.load(q_rows + kb[None, :, None] * 4 + w4[None, None, :],
                            mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
            e = tl.load(s_rows + kb[None, :], mask=n_ok[:, None] & g_ok[None, :], other=127).to(tl.int32)
            w = _e2m1_words_to_f32(words) * _e8m0_to_f32(e)[:, :, None]
            w = tl.reshape(w, [BLOCK_N, GROUPS * 32]).to(DOT_DTYPE)
            k = kb0 * 32 + kk
            xv = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
            acc = tl.dot(w, tl.trans(xv.to(DOT_DTYPE)), acc)
        acc = acc * 16384.0

        # acc is [N, M]; y is [M, N] row-major.
        y_ptrs = offs_m.to(tl.int64)[None, :] * stride_ym + offs_n[:, None]
        mask = n_ok[:, None] & m_ok[None, :]
        if SPLIT:
            tl.store(y_ptr + pid_s.to(tl.int64) * stride_ys + y_ptrs, acc, mask=mask)
        else:
            if HAS_BIAS:
                acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptr + y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _mx_dequant_kernel(q_ptr, s_ptr, w_ptr, N, KB, stride_qn, stride_sn, stride_wn,
                           BLOCK_N: tl.constexpr, GROUPS: tl.constexpr):
        """W[n, k] = value(code) * 2^(E - 127) written as bf16 (exact); q_ptr as int32 words."""
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        kb = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
        n_ok = offs_n < N
        g_ok = kb < KB
        rows = offs_n.to(tl.int64)
        w4 = tl.arange(0, 4)
        words = tl.load(q_ptr + rows[:, None, None] * stride_qn + kb[None, :, None] * 4 + w4[None, None, :],
                        mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
        e = tl.load(s_ptr + rows[:, None] * stride_sn + kb[None, :], mask=n_ok[:, None] & g_ok[None, :], other=127)
        w = (_e2m1_words_to_f32(words) * 16384.0) * _e8m0_to_f32(e.to(tl.int32))[:, :, None]
        k = kb[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
        tl.store(w_ptr + rows[:, None, None] * stride_wn + k, w.to(w_ptr.dtype.element_ty),
                 mask=n_ok[:, None, None] & g_ok[None, :, None])

    @triton.jit
    def _splitk_reduce_kernel(p_ptr, bias_ptr, y_ptr, N, stride_ps, stride_pm, stride_ym,
                              S: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        m = tl.program_id(1).to(tl.int64)
        n_ok = offs_n < N
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for s in range(0, S):
            acc += tl.load(p_ptr + s * stride_ps + m * stride_pm + offs_n, mask=n_ok, other=0.0)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 32
    groups: int = 8       # 32-blocks of K per loop iteration (GROUPS * 16 bytes of codes per row)
    split_k: int = 4      # programs along K (rounded so each holds a multiple of `groups` blocks)
    num_warps: int = 4
    prefetch: bool = False
    # "f32": each product converted to fp32 and FFMA'd; "f16x2": packed fp16 FMAs within each
    # 32-block (module docstring, "Numerics"), for the instruction count (default_gemv_config's).
    accumulate: str = "f32"
    # With more than one split: "separate" sums the fp32 partials in a second kernel
    # (_splitk_reduce_kernel); "in_kernel" has the last split program of each tile sum them
    # (_gemv_epilogue; one launch, same bits, counters from _split_counters).
    reduce: str = "separate"
    # The K loop. accumulate="f32": "block_sums" (_mx_gemv_kernel) sums each 32-block across
    # threads every iteration (Triton converts layouts through shared memory: 4 bar.sync per
    # iteration on sm_90); "elementwise" (_mx_gemv_elem_kernel) keeps a per-word fp32 accumulator
    # in the weight words' own layout, loads x per thread, and reduces once after the loop (no
    # barrier or shared memory in the loop; module docstring, "Numerics of loop").
    # accumulate="f16x2": "block_sums" is _mx_gemv_f16x2_kernel, "elementwise" is
    # _mx_gemv_elem_f16x2_kernel (threads along the blocks, x' made per thread; the default);
    loop: str = "block_sums"


GEMV_ACCUMULATE = ("f32", "f16x2")
GEMV_REDUCE = ("separate", "in_kernel")
GEMV_LOOP = ("block_sums", "elementwise")


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 16
    block_n: int = 64
    groups: int = 2       # BLOCK_K = 32 * groups
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


def _require_triton() -> None:
    if triton is None:
        raise ValueError("the Triton MX kernels need the `triton` package (pip install triton==3.6.0)")


def _split_plan(kb: int, groups: int, split_k: int) -> tuple[int, int]:
    """Blocks of K per split (a multiple of `groups`) and the number of splits actually used."""
    per = -(-kb // max(1, split_k))
    per = -(-per // groups) * groups
    return per, -(-kb // per)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # the interpreter: any small number
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def _splits_for(n_tiles: int, k: int, groups: int, per_sm: int, sms: int) -> int:
    """Split K so that at most about per_sm programs land on each SM."""
    return max(1, min(-(-k // 32) // groups, (per_sm * sms) // n_tiles))


def default_gemv_config(n: int, k: int, device: torch.device) -> GemvConfig:
    """The fastest M = 1 config measured on the H200 (2026-11-29, session 4, docs/log/mx.md): packed-fp16
    block sums with the threads along 32 blocks of K (loop="elementwise"), register prefetch, about 7
    programs per SM, the two-kernel split-K reduction (the in-kernel one was no faster for the dense
    shape and needs launches not to overlap). Large
    weights: 64 rows per program over 8 warps, 32 blocks per step (7168^2: 12.5-13.5 us, 2.5-2.7x
    bf16). Expert-sized ones: 16 rows over 4 warps, 128 blocks per step, which is the whole K of the
    k3 experts, so one program per row tile and no reduction (3584 -> 3072: 5.3 us, 2.0x)."""
    if n * k >= 1 << 25:
        cfg = GemvConfig(block_n=64, groups=32, num_warps=8, prefetch=True, accumulate="f16x2", loop="elementwise")
    else:
        cfg = GemvConfig(block_n=16, groups=128, num_warps=4, accumulate="f16x2", loop="elementwise")
    split = _splits_for(-(-n // cfg.block_n), k, cfg.groups, 7, _sm_count(device))
    return dataclasses.replace(cfg, split_k=split)


def default_grouped_gemv_config(n: int, k: int, rows: int, device: torch.device) -> GemvConfig:
    """The config for mx_gemv_grouped over `rows` (weight, x row) pairs of [n, k] weights, measured on
    the H200 for a k3 decode token's 16 routed experts (2026-11-29, session 5, docs/log/mx.md;
    benchmarks/mx_grouped.py): steps of 16 blocks when they divide K's blocks (3584 -> 7 steps,
    3072 -> 6), so no lane idles (the whole-K tile of default_gemv_config leaves 12-25 % of the lanes
    without a block at these K), 16 or 8 rows per thread (128 or 64 rows per program over 4 warps),
    whichever spreads the programs more evenly over the SMs (ties: 128, less x' work per row);
    no split (rows x row tiles programs already fill the GPU). Otherwise default_gemv_config's."""
    kb = -(-k // 32)
    if kb % 16:
        return default_gemv_config(n, k, device)
    sms = _sm_count(device)

    def imbalance(block_n: int) -> float:  # busiest SM's programs over the mean
        programs = -(-n // block_n) * rows
        return -(-programs // sms) / (programs / sms)

    block_n = min((128, 64), key=lambda b: (round(imbalance(b), 3), -b))
    return GemvConfig(block_n=block_n, groups=16, split_k=1, num_warps=4, accumulate="f16x2", loop="elementwise")


def default_gemm_config(m: int, n: int, k: int, device: torch.device) -> GemmConfig:
    if m <= 16:
        cfg = GemmConfig(block_m=16, block_n=128, groups=2, num_warps=4, num_stages=3)
    else:
        cfg = GemmConfig(block_m=64, block_n=128, groups=2, num_warps=4, num_stages=3)
    tiles = -(-n // cfg.block_n) * -(-m // cfg.block_m)
    split = _splits_for(tiles, k, cfg.groups, 4, _sm_count(device))
    return GemmConfig(cfg.block_m, cfg.block_n, cfg.groups, split, cfg.num_warps, cfg.num_stages)


def _dot_dtype():
    # The interpreter computes bf16 dots on the raw uint16 bits; fp32 operands are exact there.
    return tl.float32 if interpreter_enabled() else tl.bfloat16


def _reduce_splits(partial: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    s, m, n = partial.shape
    block = 256
    _splitk_reduce_kernel[(triton.cdiv(n, block), m)](
        partial, bias if bias is not None else partial, out, n,
        partial.stride(0), partial.stride(1), out.stride(0),
        S=s, HAS_BIAS=bias is not None, BLOCK_N=block,
    )


# device -> zeroed int32 counter buffers for reduce="in_kernel", the newest (largest) last.
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


def _split_counters(device: torch.device, size: int) -> torch.Tensor:
    """At least `size` int32 counters, all 0, for reduce="in_kernel" on `device`.

    Every launch leaves the counters it used at 0 (the last program of each tile resets its own),
    so one zeroed buffer per device serves all launches with no memset per call. Outgrown buffers
    are kept, never freed: a CUDA graph captured with one still points at it. Caveats: launches that
    may run at the same time (different streams with no order between them) share the counters and
    would miscount: use reduce="separate" there. A launch that dies mid-way leaves counters non-zero
    (a CUDA error ends the context anyway). Call once before capturing a CUDA graph, so that the
    zero-fill of a new buffer is not captured into it (it would then run at every replay)."""
    bufs = _COUNTERS.setdefault(device, [])
    if not bufs or bufs[-1].numel() < size:
        grown = max(size, 4096, 2 * bufs[-1].numel() if bufs else 0)
        bufs.append(torch.zeros(grown, device=device, dtype=torch.int32))
    return bufs[-1]


def _check_operands(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, k: int, out: torch.Tensor) -> None:
    assert x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1 and x.dtype == torch.bfloat16
    assert codes.dtype == torch.uint8 and codes.stride(1) == 1 and scales.stride(1) == 1
    assert out.shape == (x.shape[0], codes.shape[0]) and out.stride(1) == 1


def _words(codes: torch.Tensor) -> torch.Tensor:
    """Packed fp4 codes [..., N, Kp/2] bytes -> int32 words [..., N, Kp/8] (Kp is a multiple of 32)."""
    assert codes.shape[-1] % 4 == 0 and codes.stride(-1) == 1
    assert all(st % 4 == 0 for st in codes.stride()[:-1])
    return codes.view(torch.int32)


def _x_for_word_loads(x: torch.Tensor) -> torch.Tensor:
    """x itself when every row starts 16-byte aligned and K is a multiple of 8 (the 16-byte x loads of
    loop="elementwise" then never cross K); else a zero-padded copy [M, K rounded up to 8] (one small
    copy; never the case for the model's K)."""
    m, k = x.shape
    if k % 8 == 0 and x.data_ptr() % 16 == 0 and (m == 1 or x.stride(0) % 8 == 0):
        return x
    kp = -(-k // 8) * 8
    xp = torch.zeros((m, kp), device=x.device, dtype=x.dtype)
    xp[:, :k] = x
    return xp[:, :k]


def _check_gemv_config(cfg: GemvConfig) -> None:
    if cfg.accumulate not in GEMV_ACCUMULATE:
        raise ValueError(f"GemvConfig.accumulate={cfg.accumulate!r}: use one of {GEMV_ACCUMULATE}")
    if cfg.reduce not in GEMV_REDUCE:
        raise ValueError(f"GemvConfig.reduce={cfg.reduce!r}: use one of {GEMV_REDUCE}")
    if cfg.loop not in GEMV_LOOP:
        raise ValueError(f"GemvConfig.loop={cfg.loop!r}: use one of {GEMV_LOOP}")


def mx_gemv(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, k: int, bias: torch.Tensor | None,
            out: torch.Tensor, cfg: GemvConfig) -> torch.Tensor:
    """out[M, N] = x[M, K] (bf16) @ W^T for MXFP4 W given as packed codes [N, Kp/2] and scales [N, Kp/32]."""
    _require_triton()
    _check_operands(x, codes, scales, k, out)
    _check_gemv_config(cfg)
    return _launch_gemv(x, codes, scales, k, bias, out, cfg)


def mx_gemv_grouped(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor, k: int,
                    out: torch.Tensor, cfg: GemvConfig | None = None) -> torch.Tensor:
    """out[j] = x[j] @ W[ids[j]]^T for a stack of MXFP4 weights (codes [E, N, Kp/2], scales [E, N, Kp/32]),
    in one launch: the decode step of a mixture of experts, where one token's rows go through its
    routed experts (x [G, K] bf16, one row per routed expert, or a stride-0 expand of one row; ids [G]
    int32 in [0, E); out [G, N]). Only the default GEMV kernel (accumulate="f16x2",
    loop="elementwise") runs grouped; cfg None is default_grouped_gemv_config's. The ids are not
    range-checked on the device (an id outside [0, E) reads out of bounds): mx_gemv_grouped checks
    them on the host only when they are on the CPU."""
    _require_triton()
    if codes.dim() != 3 or scales.dim() != 3 or codes.shape[:2] != scales.shape[:2]:
        raise ValueError(f"grouped weights: codes [E, N, Kp/2] and scales [E, N, Kp/32] with the same E, N; "
                         f"got {tuple(codes.shape)} and {tuple(scales.shape)}")
    if ids.dim() != 1 or ids.shape[0] != x.shape[0] or ids.dtype != torch.int32 or ids.device != x.device:
        raise ValueError(f"ids: int32 [G] on x's device with G = x.shape[0] = {x.shape[0]}; "
                         f"got {ids.dtype} {tuple(ids.shape)} on {ids.device}")
    if ids.device.type == "cpu" and ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < codes.shape[0]):
        raise ValueError(f"ids must lie in [0, {codes.shape[0]})")
    if cfg is None:
        cfg = default_grouped_gemv_config(codes.shape[1], k, x.shape[0], x.device)
    if (cfg.accumulate, cfg.loop) != ("f16x2", "elementwise"):
        raise ValueError("mx_gemv_grouped runs the default GEMV kernel only: GemvConfig(accumulate='f16x2', "
                         f"loop='elementwise'), got accumulate={cfg.accumulate!r}, loop={cfg.loop!r}")
    if x.stride(0) == 0:  # one row for every expert: the kernel reads row 0 G times
        _check_operands(x[:1], codes[0], scales[0], k, out[:1])
    else:
        _check_operands(x, codes[0], scales[0], k, out)
    _check_gemv_config(cfg)
    return _launch_gemv(x, codes, scales, k, None, out, cfg, ids)


def _launch_gemv(x, codes, scales, k, bias, out, cfg: GemvConfig, ids: torch.Tensor | None = None) -> torch.Tensor:
    """The GEMV launch(es) behind mx_gemv and mx_gemv_grouped (ids: one weight of the stack per row)."""
    elementwise = cfg.loop == "elementwise"  # x read 16 bytes at a time
    if elementwise and x.stride(0) == 0 and x.shape[0] > 1:  # one row read by every program row
        x = _x_for_word_loads(x[:1]).expand(x.shape[0], -1)
    elif elementwise:
        x = _x_for_word_loads(x)
    m, n, kb = x.shape[0], codes.shape[-2], scales.shape[-1]
    per, splits = _split_plan(kb, cfg.groups, cfg.split_k)
    grid = (triton.cdiv(n, cfg.block_n), m, splits)
    # 0: one split writes out; 1: partials, then _reduce_splits; 2: partials, the last program sums.
    reduce = 0 if splits == 1 else (2 if cfg.reduce == "in_kernel" else 1)
    partial = torch.empty((splits, m, n), device=x.device, dtype=torch.float32) if splits > 1 else out
    counters = _split_counters(x.device, grid[0] * m) if reduce == 2 else partial
    words = _words(codes)
    ptrs = (x, words, scales, bias if bias is not None else scales, out, partial, counters)
    sizes = (n, k, kb, per, x.stride(0), words.stride(-2), scales.stride(-2), out.stride(0), partial.stride(0),
             partial.stride(-2))
    meta = dict(ITERS=per // cfg.groups, HAS_BIAS=bias is not None, SPLITS=splits, REDUCE=reduce,
                BLOCK_N=cfg.block_n, GROUPS=cfg.groups, PREFETCH=cfg.prefetch, num_warps=cfg.num_warps)
    if cfg.accumulate == "f16x2" and elementwise:
        grouped = (ids, words.stride(0), scales.stride(0)) if ids is not None else (scales, 0, 0)
        _mx_gemv_elem_f16x2_kernel[grid](*ptrs, grouped[0], *sizes, *grouped[1:], **meta,
                                         ASM=not interpreter_enabled(), GROUPED=ids is not None)
    elif cfg.accumulate == "f16x2":
        _mx_gemv_f16x2_kernel[grid](*ptrs, *sizes, **meta, ASM=not interpreter_enabled())
    elif elementwise:
        _mx_gemv_elem_kernel[grid](*ptrs, *sizes, **meta, ASM=not interpreter_enabled())
    else:
        _mx_gemv_kernel[grid](*ptrs, *sizes, **meta)
    if reduce == 1:
        _reduce_splits(partial, bias, out)
    return out


def gemv_error_bound(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, accumulate: str,
                     bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32,
                     loop: str = "block_sums", groups: int | None = None) -> torch.Tensor:
    """Bound [M, N] (float64) on |mx_gemv(x, ...) - y_exact| for the GEMV kernels, from the module
    docstring's "Numerics"; y_exact = x.double() @ w.T (+ bias), w = the dequantized weight [N, K]
    (float64), scales the E8M0 codes [N, KB], x [M, K] in bf16 (for the x blocks' exponents p_g).
    loop="elementwise" (accumulate="f32" only) needs the config's `groups` (the final tree spans
    4 * groups per-word accumulators)."""
    if accumulate not in GEMV_ACCUMULATE:
        raise ValueError(f"accumulate={accumulate!r}: use one of {GEMV_ACCUMULATE}")
    if loop not in GEMV_LOOP:
        raise ValueError(f"loop={loop!r}: use one of {GEMV_LOOP}")
    if loop == "elementwise" and accumulate == "f32" and groups is None:
        raise ValueError(f"loop={loop!r} bounds with accumulate={accumulate!r} need groups=<the config's groups>")
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
    # (y * 2^-14) errs by at most 2^-150, i.e. 2^-136 in y's, times the block scale where that exceeds 1
    # (the default kernel's per-product sums are in units of the scale).
    big_scale = torch.exp2((e - 127).clamp(min=0).double()).amax(dim=1)  # [N]
    under32 = (2 * kb + 96) * 2.0**-136 * big_scale[None, :].expand(m, n)
    if loop == "elementwise" and accumulate == "f32":
        # Every product w' x is exact and every scale product exact (barring underflow); a term
        # passes through 7 chain additions, ITERS accumulator additions, a tree over 4 * groups
        # and S - 1 split additions (ITERS, S <= KB): depth <= 2 KB + 4 groups + 8.
        d = 2 * kb + 4 * groups + 8
        # Underflow: per word 8 products + 7 chain additions before the scale (x the scale where it
        # exceeds 1) and 2 after; then the tree and the splits: <= 70 KB + 4 groups + 8 roundings.
        under = (70 * kb + 4 * groups + 8) * 2.0**-136 * big_scale[None, :].expand(m, n)
        bound = gamma(d, u32) * abs_sum + (1 + gamma(d, u32)) * under
    elif accumulate == "f32":
        bound = gamma(32, u32) * abs_sum + g32 * (1 + gamma(32, u32)) * abs_sum + under32
    else:
        amax = xd.abs().reshape(m, kb, 32).amax(dim=2)
        # _gemv_x_pairs_in_thread (loop="elementwise") clamps p at -113, _gemv_x_pairs at -126.
        p_min = -113 if loop == "elementwise" else -126
        p = torch.floor(torch.log2(amax.clamp(min=2.0**-126))).clamp(p_min, 127)
        block = torch.exp2(p)[:, None, :] * torch.exp2((e - 127).double())[None, :, :]  # [M, N, KB]
        under16 = 40 * 2.0**-25 * block.sum(dim=2)
        g6 = gamma(6, u16)
        bound = g6 * abs_sum + under16 + g32 * (1 + g6) * abs_sum + under32
    if bias is not None:
        bound = bound + u32 * (y.abs() + bound)
    if out_dtype != torch.float32:
        bound = bound + torch.finfo(out_dtype).eps / 2 * (y.abs() + bound)
    return bound


def mx_gemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, k: int, bias: torch.Tensor | None,
            out: torch.Tensor, cfg: GemmConfig) -> torch.Tensor:
    """Same contract as mx_gemv, on the tensor cores, for larger M."""
    _require_triton()
    _check_operands(x, codes, scales, k, out)
    m, n, kb = x.shape[0], codes.shape[0], scales.shape[1]
    per, splits = _split_plan(kb, cfg.groups, cfg.split_k)
    target = torch.empty((splits, m, n), device=x.device, dtype=torch.float32) if splits > 1 else out
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), splits)
    words = _words(codes)
    _mx_gemm_kernel[grid](
        x, words, scales, bias if bias is not None else scales, target,
        m, n, k, kb, per,
        x.stride(0), words.stride(0), scales.stride(0), target.stride(-2), target.stride(0),
        ITERS=per // cfg.groups, HAS_BIAS=bias is not None, SPLIT=splits > 1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        GROUPS=cfg.groups, DOT_DTYPE=_dot_dtype(), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        _reduce_splits(target, bias, out)
    return out


def dequant_fp4_bf16(codes: torch.Tensor, scales: torch.Tensor, k: int) -> torch.Tensor:
    """MXFP4 weight (packed codes [N, Kp/2], scales [N, Kp/32]) -> bf16 [N, k] in one pass (exact)."""
    _require_triton()
    n, kb = scales.shape
    out = torch.empty((n, kb * 32), device=codes.device, dtype=torch.bfloat16)
    words = _words(codes)
    block_n, groups = 32, 4
    _mx_dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(kb, groups))](
        words, scales, out, n, kb, words.stride(0), scales.stride(0), out.stride(0),
        BLOCK_N=block_n, GROUPS=groups, num_warps=4,
    )
    return out[:, :k]


def fake_quant_triton(x: torch.Tensor, fmt: str, block_size: int = 32, scale_rounding: str = "ceil") -> torch.Tensor:
    """One-kernel fake quantization, bit-identical to kernels.mx.quant.fake_quant_torch (no autograd)."""
    _require_triton()
    f = get_format(fmt)
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding={scale_rounding!r}: use one of {SCALE_ROUNDINGS}")
    if block_size & (block_size - 1) or not 2 <= block_size <= 256:
        raise ValueError(f"the Triton fake-quant kernel takes a power-of-two block_size in [2, 256], got {block_size}")
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    block_k = max(block_size, 128)
    block_r = 8
    grid = (triton.cdiv(x2.shape[0], block_r), triton.cdiv(k, block_k))
    _fake_quant_kernel[grid](
        x2, y, x2.shape[0], k, x2.stride(0), y.stride(0),
        BLOCK_R=block_r, BLOCK_K=block_k, BS=block_size,
        EMAX=f.emax, EMIN=f.emin, MBITS=f.mbits, MAXV=f.max_normal, MAX_MANT=f.max_mantissa_fp32,
        CEIL=scale_rounding == "ceil", num_warps=4,
    )
    return y.reshape(x.shape)


__all__ = [
    "GemvConfig", "GemmConfig", "GEMV_ACCUMULATE", "GEMV_REDUCE", "GEMV_LOOP", "gemv_error_bound", "default_gemv_config",
    "default_gemm_config", "mx_gemv", "mx_gemm", "dequant_fp4_bf16",
    "fake_quant_triton", "triton_available", "interpreter_enabled",
]
