"""Chunkwise KDA in Triton: forward and backward, chunk 64, fp32 state, bf16/fp16/fp32 inputs.

Kimi Linear report §2.1 (Eqs. 3–9); research/kda.md §2; the torch twin is `chunk_torch.py`.
Per chunk of C = 64 tokens, with the chunk-local cumulative log decay G_r = Σ_{i≤r} g_i (per key
channel; the kernels carry it in log2 units and use exp2):

    A_kk[r, i] = β_r Σ_d k_r[d] k_i[d] e^{G_r[d] − G_i[d]}        i < r
    A_qk[r, j] = scale Σ_d q_r[d] k_j[d] e^{G_r[d] − G_j[d]}      j ≤ r
    T = (I + A_kk)⁻¹,   W = T (β ⊙ e^G ⊙ K),   U = T (β ⊙ V)       (UT transform)
    KG = K ⊙ e^{G_C − G},   QG = scale · Q ⊙ e^G,   γ = e^{G_C}

and, sequentially over chunks, S the fp32 state entering the chunk:

    V_new = U − W S
    O     = QG S + A_qk V_new
    S'    = γ ⊙ S + KGᵀ V_new

Kernels, in the order they run:
1. `_prep_kernel` (parallel over chunks): everything that does not depend on S. It stores G (log2
   units; the backward reuses it), then builds A_qk and A_kk on full 64-row tiles with tensor-core
   products over three pair regions that partition the lower triangle ("secondary chunking"): the
   diagonal 16-blocks, blocks (1, 0) and (3, 2), and rows 32–63 × columns 0–31. Inside a region a
   pair r ≥ j factors its decay as 2^{G_r − G_p} · 2^{G_p − G_j} through the region's anchor row p,
   which always lies in the past of r: the first row of the block for the diagonal region (both
   factors shifted by 2^±DIAG_SHIFT to stay in fp32 range), and a row between the two blocks
   otherwise, where both factors are ≤ 1. No anchor is a future row, so prefix outputs do not depend
   on later gates at all (fla issue #1240). T = (I + A_kk)⁻¹ by doubling:
   (I − A)(I + A²)(I + A⁴)…(I + A³²), ten 64×64 products in tf32x3.
2. `_fwd_state_kernel` (sequential over chunks, parallel over batch·heads and value blocks): the
   state hand-off S → S' and the output, fused. The chunk's loads are software-pipelined ahead of the
   serial chain, and the S-independent products (QG S shares its operand with W S; A_qk V_new runs
   off the state's critical path) are issued alongside the state update, so the serial chain per
   chunk is two small products: W S and KGᵀ V_new. With gradients required it also stores S per
   chunk (bf16) and V_new, so the backward never reruns the forward recurrence.

Backward, with dO and dS_final given:
3. `_bwd_state_kernel` (sequential, reverse): dV_new = A_qkᵀ dO + KG dS',
   dS = γ ⊙ dS' + QGᵀ dO − Wᵀ dV_new; stores dS' per chunk and dV_new.
4. `_bwd_chunk_kernel` (parallel over chunks): with X = β(V − e^G K S) so that V_new = T X,
   dX = Tᵀ dV_new and dA_kk = −dX V_newᵀ (strictly lower), which needs neither W nor dT; then the
   gradients of QG, KG, γ and of the pairwise matrices A_qk and A_kk with respect to q, k, G and β,
   over the same three anchored regions; dg is the reverse cumulative sum of dG over the chunk.

Variants (`TileConfig`; the defaults are the fused kernels above). Prep and backward chunk run
8 warps at 255 registers, one CTA per SM, with 30–90 dependent small products per chunk; the splits
trade extra fp32 scratch traffic for fewer live registers per kernel, so each may run at 4 warps
with several CTAs per SM. All variants equal the default path in the interpreter.
- `prep_split`: `_prep_pairs_kernel` (G, QG, KG, γ, A_qk, and β ⊙ A_kk to fp32 scratch), then
  `_prep_solve_kernel` (inverse, W, U).
- `bwd_split`: `_bwd_values_kernel` (dv, dA_kk, dA_qk and, per key slice, dQG, dKG, dX Sᵀ,
  Σ S ⊙ dS' to fp32 scratch), then `_bwd_pairs_kernel` (QG / KG / γ terms, pair regions, dq, dk,
  dg, dβ).
- `inverse_precision="tf32"`: one tf32 pass per product of the doubling inverse instead of three.
- `inverse="substitution"` (with `prep_split`): T by forward substitution in the diagonal 16-blocks
  and a block merge instead of doubling. The doubling forms A², …, A³², which for positive keys
  and weak decays grow to ~10² although T stays ≤ 1, and loses accuracy (docs/log/kda.md).

Exactness of the anchored factorization: inside one 16-token block the per-channel log decay
(G at the block's first row minus G at a later row) must stay below DIAG_SHIFT + EXP2_CLAMP = 164
in log2 units, about 114 nats (a mean log decay above −7.6 per token over the block; any gate
bounded below by −5, as K3's safe gate is, qualifies). Beyond that the intra-block terms are
clamped: they stay finite, never NaN, but lose accuracy — use backend="torch" for such gates.
Outside the diagonal blocks every factor is ≤ 1, so any decay is exact there.

Legend: B batch, T tokens, H heads, K key width, V value width, NT chunks, BT = 64 chunk rows,
BK/BV tile widths. Layouts follow fla: [B, T, H, D] inputs, [B, H, K, V] fp32 states.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

CHUNK = 64
LOG2E = 1.4426950408889634
# Diagonal 16-blocks: row factors 2^(G_r − G_p + SHIFT) ≤ 2^SHIFT, column factors
# 2^(G_p − SHIFT − G_j) ≥ 2^−SHIFT. Exponents are clamped at EXP2_CLAMP so that no product,
# not even one the causal mask discards, overflows to inf (inf · 0 would be NaN).
DIAG_SHIFT = 64.0
EXP2_CLAMP = 100.0
MAX_K = 128
MAX_V = 256


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _load_rows(ptr, t_start, T, stride, o_c, m_c, NR: tl.constexpr):
    """Rows t_start … t_start+NR−1 of a [T, ·] view with row stride `stride`; zeros past T."""
    o_t = t_start + tl.arange(0, NR)
    m = (o_t < T)[:, None] & m_c[None, :]
    return tl.load(ptr + o_t[:, None] * stride + o_c[None, :], mask=m, other=0.0)


@triton.jit
def _store_rows(ptr, val, t_start, T, stride, o_c, m_c, NR: tl.constexpr):
    o_t = t_start + tl.arange(0, NR)
    m = (o_t < T)[:, None] & m_c[None, :]
    tl.store(ptr + o_t[:, None] * stride + o_c[None, :], val.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def _anchor_rows(Gs, t0, T, sk, o_k, m_k):
    """G at rows 0, 16, 32, 48 and 63 of the chunk (clamped to the last valid row), each [BKS]."""
    p0 = tl.load(Gs + t0 * sk + o_k, mask=m_k, other=0.0)
    p16 = tl.load(Gs + tl.minimum(t0 + 16, T - 1) * sk + o_k, mask=m_k, other=0.0)
    p32 = tl.load(Gs + tl.minimum(t0 + 32, T - 1) * sk + o_k, mask=m_k, other=0.0)
    p48 = tl.load(Gs + tl.minimum(t0 + 48, T - 1) * sk + o_k, mask=m_k, other=0.0)
    p63 = tl.load(Gs + tl.minimum(t0 + 63, T - 1) * sk + o_k, mask=m_k, other=0.0)
    return p0, p16, p32, p48, p63


@triton.jit
def _anchor(p0, p16, p32, p48, REGION: tl.constexpr):
    """Per-position anchor [64, BKS] of a pair region: 0 diagonal 16-blocks (the block's first row),
    1 blocks (1, 0) and (3, 2) (rows 16 and 48), 2 rows 32–63 × columns 0–31 (row 32)."""
    rb = (tl.arange(0, 64) // 16)[:, None]
    if REGION == 0:
        return tl.where(rb == 0, p0[None, :], tl.where(rb == 1, p16[None, :],
                        tl.where(rb == 2, p32[None, :], p48[None, :])))
    elif REGION == 1:
        return tl.where(rb < 2, p16[None, :], p48[None, :])
    else:
        return tl.where(rb < 64, p32[None, :], 0.0)


@triton.jit
def _region_mask(REGION: tl.constexpr):
    c = tl.arange(0, 64) // 16
    rb = c[:, None]
    jb = c[None, :]
    if REGION == 0:
        return rb == jb
    elif REGION == 1:
        return ((rb % 2) == 1) & (jb == rb - 1)
    else:
        return (rb >= 2) & (jb < 2)


@triton.jit
def _pair_operand(x, PAIR_BF16: tl.constexpr):
    """x as an operand of the pair-region products (_region_products, _pair_region): bf16 when
    PAIR_BF16, else fp32 (tf32 products)."""
    if PAIR_BF16:
        return x.to(tl.bfloat16)
    else:
        return x


@triton.jit
def _region_products(acc_qk, acc_kk, qF, kF, GF, p0, p16, p32, p48, REGION: tl.constexpr,
                     shift: tl.constexpr, clamp: tl.constexpr, PAIR_BF16: tl.constexpr):
    """Adds (Q Kᵀ, K Kᵀ) with decay 2^{G_r − G_j} inside one pair region (module docstring);
    PAIR_BF16: bf16 operands (fp32 accumulation) instead of fp32 (tf32) ones."""
    anc = _anchor(p0, p16, p32, p48, REGION)
    rf = tl.exp2(tl.minimum(GF - anc + shift, clamp))
    kc = tl.trans(kF * tl.exp2(tl.minimum(anc - shift - GF, clamp)))
    M = _region_mask(REGION)
    kc = _pair_operand(kc, PAIR_BF16)
    acc_qk += tl.where(M, tl.dot(_pair_operand(qF * rf, PAIR_BF16), kc), 0.0)
    acc_kk += tl.where(M, tl.dot(_pair_operand(kF * rf, PAIR_BF16), kc), 0.0)
    return acc_qk, acc_kk


@triton.jit
def _inv_unit_lower64(A, PREC: tl.constexpr):
    """(I + A)⁻¹ for strictly lower-triangular A [64, 64]: A⁶⁴ = 0, so
    (I + A)⁻¹ = (I − A)(I + A²)(I + A⁴)(I + A⁸)(I + A¹⁶)(I + A³²) — ten tensor-core products.
    PREC "tf32x3" is about fp32 accuracy (three tf32 passes each); "tf32" one pass, whose error
    stays below the bf16 rounding T is stored with (tests/kernels/kda/test_inverse_precision.py)."""
    c = tl.arange(0, 64)
    eye = tl.where(c[:, None] == c[None, :], 1.0, 0.0)
    X = eye - A
    P = tl.dot(A, A, input_precision=PREC)
    X = tl.dot(X, eye + P, input_precision=PREC)
    P = tl.dot(P, P, input_precision=PREC)
    X = tl.dot(X, eye + P, input_precision=PREC)
    P = tl.dot(P, P, input_precision=PREC)
    X = tl.dot(X, eye + P, input_precision=PREC)
    P = tl.dot(P, P, input_precision=PREC)
    X = tl.dot(X, eye + P, input_precision=PREC)
    P = tl.dot(P, P, input_precision=PREC)
    return tl.dot(X, eye + P, input_precision=PREC)


@triton.jit
def _prep_pairs(q, k, g, beta, Gs, Aqk, QG, KG, GAM, scale, t0, T,
                H: tl.constexpr, K: tl.constexpr, BKS: tl.constexpr,
                SHIFT: tl.constexpr, CLAMP: tl.constexpr, PAIR_BF16: tl.constexpr = False):
    """One chunk's G, QG, KG, γ and A_qk (stored); returns β ⊙ A_kk, strictly lower [64, 64] fp32,
    and β [64, 1] fp32. Pointers are already offset to (batch, head)."""
    sk = H * K
    c64 = tl.arange(0, 64)
    all64 = c64 < 64
    one = tl.full([1], 1, dtype=tl.int1)
    zc = tl.zeros([1], dtype=tl.int32)

    # ---- G = chunk-local cumsum in log2 units, kept for the rest and for the backward -------
    for i_k in range(tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = o_k < K
        GF = tl.cumsum(_load_rows(g, t0, T, sk, o_k, m_k, 64).to(tl.float32) * 1.4426950408889634, 0)
        _store_rows(Gs, GF, t0, T, sk, o_k, m_k, 64)
    # The anchors are single rows of G, read back from memory: make the stores visible first.
    tl.debug_barrier()

    # ---- A_qk, A_kk over three anchored regions; QG, KG, γ ----------------------------------
    acc_qk = tl.zeros([64, 64], dtype=tl.float32)
    acc_kk = tl.zeros([64, 64], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = o_k < K
        GF = _load_rows(Gs, t0, T, sk, o_k, m_k, 64)
        p0, p16, p32, p48, GC = _anchor_rows(Gs, t0, T, sk, o_k, m_k)
        kF = _load_rows(k, t0, T, sk, o_k, m_k, 64).to(tl.float32)
        qF = _load_rows(q, t0, T, sk, o_k, m_k, 64).to(tl.float32)
        _store_rows(KG, kF * tl.exp2(GC[None, :] - GF), t0, T, sk, o_k, m_k, 64)
        _store_rows(QG, qF * tl.exp2(GF) * scale, t0, T, sk, o_k, m_k, 64)
        tl.store(GAM + o_k, tl.exp2(GC), mask=m_k)
        acc_qk, acc_kk = _region_products(acc_qk, acc_kk, qF, kF, GF, p0, p16, p32, p48, 0, SHIFT, CLAMP, PAIR_BF16)
        acc_qk, acc_kk = _region_products(acc_qk, acc_kk, qF, kF, GF, p0, p16, p32, p48, 1, 0.0, 0.0, PAIR_BF16)
        acc_qk, acc_kk = _region_products(acc_qk, acc_kk, qF, kF, GF, p0, p16, p32, p48, 2, 0.0, 0.0, PAIR_BF16)
    bF = _load_rows(beta, t0, T, H, zc, one, 64).to(tl.float32)  # [64, 1]
    acc_qk = tl.where(c64[:, None] >= c64[None, :], acc_qk * scale, 0.0)
    _store_rows(Aqk, acc_qk, t0, T, H * 64, c64, all64, 64)
    return tl.where(c64[:, None] > c64[None, :], acc_kk * bF, 0.0), bF


@triton.jit
def _prep_wu(Tc, bF, k, v, Gs, W, U, t0, T,
             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr):
    """W = T (β ⊙ e^G ⊙ K), U = T (β ⊙ V) for one chunk, T given as a [64, 64] tile in Ti's dtype."""
    sk = H * K
    sv = H * V
    for i_k in range(tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = o_k < K
        GF = _load_rows(Gs, t0, T, sk, o_k, m_k, 64)
        kF = _load_rows(k, t0, T, sk, o_k, m_k, 64).to(tl.float32)
        _store_rows(W, tl.dot(Tc, (kF * tl.exp2(GF) * bF).to(Tc.dtype)), t0, T, sk, o_k, m_k, 64)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        vF = _load_rows(v, t0, T, sv, o_v, m_v, 64).to(tl.float32)
        _store_rows(U, tl.dot(Tc, (vF * bF).to(Tc.dtype)), t0, T, sv, o_v, m_v, 64)


@triton.jit
def _prep_solve(A, bF, k, v, Gs, Ti, W, U, t0, T,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BKS: tl.constexpr, BV: tl.constexpr, INV_PREC: tl.constexpr):
    """T = (I + A)⁻¹ by doubling (stored), then W and U, for one chunk, A = β ⊙ A_kk."""
    c64 = tl.arange(0, 64)
    Tc = _inv_unit_lower64(A, INV_PREC).to(Ti.dtype.element_ty)
    _store_rows(Ti, Tc, t0, T, H * 64, c64, c64 < 64, 64)
    _prep_wu(Tc, bF, k, v, Gs, W, U, t0, T, H, K, V, BKS, BV)


@triton.jit
def _block16(A, t0, T, bi: tl.constexpr, bj: tl.constexpr, sa):
    """Block (bi, bj) [16, 16] of a chunk's [64, 64] rows in memory; rows past T read as zero."""
    o16 = tl.arange(0, 16)
    rows = t0 + 16 * bi + o16
    return tl.load(A + rows[:, None] * sa + 16 * bj + o16[None, :], mask=(rows < T)[:, None], other=0.0)


@triton.jit
def _store_block16(Ti, val, t0, T, bi: tl.constexpr, bj: tl.constexpr, sa):
    o16 = tl.arange(0, 16)
    rows = t0 + 16 * bi + o16
    tl.store(Ti + rows[:, None] * sa + 16 * bj + o16[None, :], val.to(Ti.dtype.element_ty),
             mask=(rows < T)[:, None])


@triton.jit
def _inv_diag16x4(A, t0, T, sa):
    """(I + A_bb)⁻¹ of the four diagonal 16-blocks b at once, by forward substitution one row at a
    time: row i of N = T − I is −A_i − Σ_{m<i} A_im N_m (rows 0 and 1 need no update). The blocks
    are one [4, 16, 16] tensor, so the 14 dependent steps serve all four (a loop per block took 56).
    Returns X_00, X_11, X_22, X_33 as [16, 16] tiles."""
    o4 = tl.arange(0, 4)
    o16 = tl.arange(0, 16)
    rows = t0 + 16 * o4[:, None, None] + o16[None, :, None]
    cols = 16 * o4[:, None, None] + o16[None, None, :]
    lower = o16[None, :, None] > o16[None, None, :]
    N = -tl.where(lower, tl.load(A + rows * sa + cols, mask=rows < T, other=0.0), 0.0)
    for i in range(2, 16):
        row = t0 + 16 * o4 + i
        a = -tl.load(A + row[:, None] * sa + 16 * o4[:, None] + o16[None, :],
                     mask=(o16[None, :] < i) & (row < T)[:, None], other=0.0)
        a += tl.sum(a[:, :, None] * N, 1)
        N = tl.where(o16[None, :, None] == i, a[:, None, :], N)
    X = N + tl.where(o16[None, :, None] == o16[None, None, :], 1.0, 0.0)
    # [4, 16, 16] -> [16, 16, 2 (b // 2), 2 (b % 2)] -> the four blocks.
    even, odd = tl.split(tl.reshape(tl.permute(X, (1, 2, 0)), [16, 16, 2, 2]))
    X00, X22 = tl.split(even)
    X11, X33 = tl.split(odd)
    return X00, X11, X22, X33


@triton.jit
def _inv_unit_lower64_substitution(A, Ti, t0, T, sa, PREC: tl.constexpr):
    """(I + A)⁻¹ for the chunk's strictly lower A [64, 64] (rows in memory), stored to Ti: forward
    substitution inside the four diagonal 16-blocks, then block forward substitution,
    X_ij = −X_ii Σ_{j≤m<i} A_im X_mj (fla's `solve_tril`). Stable where the doubling is not
    (positive keys with weak decay, docs/log/kda.md): no power of A is ever formed."""
    X00, X11, X22, X33 = _inv_diag16x4(A, t0, T, sa)
    A10 = _block16(A, t0, T, 1, 0, sa)
    A21 = _block16(A, t0, T, 2, 1, sa)
    A32 = _block16(A, t0, T, 3, 2, sa)
    X10 = -tl.dot(X11, tl.dot(A10, X00, input_precision=PREC), input_precision=PREC)
    X21 = -tl.dot(X22, tl.dot(A21, X11, input_precision=PREC), input_precision=PREC)
    X32 = -tl.dot(X33, tl.dot(A32, X22, input_precision=PREC), input_precision=PREC)
    A20 = _block16(A, t0, T, 2, 0, sa)
    A31 = _block16(A, t0, T, 3, 1, sa)
    X20 = tl.dot(A20, X00, input_precision=PREC)
    X20 = -tl.dot(X22, tl.dot(A21, X10, X20, input_precision=PREC), input_precision=PREC)
    X31 = tl.dot(A31, X11, input_precision=PREC)
    X31 = -tl.dot(X33, tl.dot(A32, X21, X31, input_precision=PREC), input_precision=PREC)
    A30 = _block16(A, t0, T, 3, 0, sa)
    X30 = tl.dot(A30, X00, input_precision=PREC)
    X30 = tl.dot(A31, X10, X30, input_precision=PREC)
    X30 = -tl.dot(X33, tl.dot(A32, X20, X30, input_precision=PREC), input_precision=PREC)
    zero = tl.zeros([16, 16], dtype=tl.float32)
    _store_block16(Ti, X00, t0, T, 0, 0, sa)
    _store_block16(Ti, zero, t0, T, 0, 1, sa)
    _store_block16(Ti, zero, t0, T, 0, 2, sa)
    _store_block16(Ti, zero, t0, T, 0, 3, sa)
    _store_block16(Ti, X10, t0, T, 1, 0, sa)
    _store_block16(Ti, X11, t0, T, 1, 1, sa)
    _store_block16(Ti, zero, t0, T, 1, 2, sa)
    _store_block16(Ti, zero, t0, T, 1, 3, sa)
    _store_block16(Ti, X20, t0, T, 2, 0, sa)
    _store_block16(Ti, X21, t0, T, 2, 1, sa)
    _store_block16(Ti, X22, t0, T, 2, 2, sa)
    _store_block16(Ti, zero, t0, T, 2, 3, sa)
    _store_block16(Ti, X30, t0, T, 3, 0, sa)
    _store_block16(Ti, X31, t0, T, 3, 1, sa)
    _store_block16(Ti, X32, t0, T, 3, 2, sa)
    _store_block16(Ti, X33, t0, T, 3, 3, sa)


@triton.jit
def _prep_kernel(
    q, k, v, g, beta,
    Gs, Ti, Aqk, W, U, QG, KG, GAM,
    scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BKS: tl.constexpr, BV: tl.constexpr,
    SHIFT: tl.constexpr, CLAMP: tl.constexpr, INV_PREC: tl.constexpr,
):
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    NT = (T + 63) // 64
    t0 = i_t * 64
    bt = i_b.to(tl.int64) * T * H + i_h  # (b, t=0, h) as a flat token-head index
    q += bt * K
    k += bt * K
    g += bt * K
    Gs += bt * K
    v += bt * V
    beta += bt
    Ti += bt * 64
    Aqk += bt * 64
    W += bt * K
    U += bt * V
    QG += bt * K
    KG += bt * K
    GAM += ((i_b * NT + i_t) * H + i_h).to(tl.int64) * K
    A, bF = _prep_pairs(q, k, g, beta, Gs, Aqk, QG, KG, GAM, scale, t0, T, H, K, BKS, SHIFT, CLAMP)
    _prep_solve(A, bF, k, v, Gs, Ti, W, U, t0, T, H, K, V, BKS, BV, INV_PREC)


@triton.jit
def _prep_pairs_kernel(
    q, k, g, beta,
    Gs, Akk, Aqk, QG, KG, GAM,
    scale, T,
    H: tl.constexpr, K: tl.constexpr, BKS: tl.constexpr,
    SHIFT: tl.constexpr, CLAMP: tl.constexpr, PAIR_BF16: tl.constexpr,
):
    """Split prep, part 1: `_prep_pairs`, with β ⊙ A_kk going to fp32 scratch `Akk` [B, T, H, 64]."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    NT = (T + 63) // 64
    t0 = i_t * 64
    bt = i_b.to(tl.int64) * T * H + i_h
    q += bt * K
    k += bt * K
    g += bt * K
    Gs += bt * K
    beta += bt
    Akk += bt * 64
    Aqk += bt * 64
    QG += bt * K
    KG += bt * K
    GAM += ((i_b * NT + i_t) * H + i_h).to(tl.int64) * K
    c64 = tl.arange(0, 64)
    A, bF = _prep_pairs(q, k, g, beta, Gs, Aqk, QG, KG, GAM, scale, t0, T, H, K, BKS, SHIFT, CLAMP, PAIR_BF16)
    _store_rows(Akk, A, t0, T, H * 64, c64, c64 < 64, 64)


@triton.jit
def _prep_solve_kernel(
    k, v, beta, Gs, Akk,
    Ti, W, U,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BKS: tl.constexpr, BV: tl.constexpr, INV_PREC: tl.constexpr, SUBSTITUTION: tl.constexpr,
):
    """Split prep, part 2: T = (I + β ⊙ A_kk)⁻¹ from part 1's scratch `Akk` (doubling, or
    substitution when SUBSTITUTION), then W and U."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * 64
    bt = i_b.to(tl.int64) * T * H + i_h
    k += bt * K
    v += bt * V
    beta += bt
    Gs += bt * K
    Akk += bt * 64
    Ti += bt * 64
    W += bt * K
    U += bt * V
    c64 = tl.arange(0, 64)
    one = tl.full([1], 1, dtype=tl.int1)
    zc = tl.zeros([1], dtype=tl.int32)
    bF = _load_rows(beta, t0, T, H, zc, one, 64).to(tl.float32)
    if SUBSTITUTION:
        _inv_unit_lower64_substitution(Akk, Ti, t0, T, H * 64, INV_PREC)
        # T was stored in 16-blocks; W and U read it back whole: make the stores visible.
        tl.debug_barrier()
        Tc = _load_rows(Ti, t0, T, H * 64, c64, c64 < 64, 64)
        _prep_wu(Tc, bF, k, v, Gs, W, U, t0, T, H, K, V, BKS, BV)
    else:
        # Rows and columns past T are zero, as the fused kernel has them (k = β = 0 there).
        A = _load_rows(Akk, t0, T, H * 64, c64, c64 < 64, 64)
        _prep_solve(A, bF, k, v, Gs, Ti, W, U, t0, T, H, K, V, BKS, BV, INV_PREC)


@triton.jit
def _fwd_state_kernel(
    W, U, QG, KG, Aqk, GAM, h0, o, ht, hs, vnew,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, SAVE: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    NT = (T + 63) // 64
    bt = i_b.to(tl.int64) * T * H + i_h
    W += bt * K
    QG += bt * K
    KG += bt * K
    U += bt * V
    o += bt * V
    Aqk += bt * 64
    sk = H * K
    sv = H * V
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    c64 = tl.arange(0, 64)
    all64 = c64 < 64
    m_kv = m_k[:, None] & m_v[None, :]
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
    if SAVE:
        vnew += bt * V
    for n in range(NT):
        t0 = n * 64
        if SAVE:
            p_h = hs + ((i_b * NT + n) * H + i_h).to(tl.int64) * K * V
            tl.store(p_h + o_k[:, None] * V + o_v[None, :], S.to(hs.dtype.element_ty), mask=m_kv)
        b_w = _load_rows(W, t0, T, sk, o_k, m_k, 64)
        b_qg = _load_rows(QG, t0, T, sk, o_k, m_k, 64)
        b_u = _load_rows(U, t0, T, sv, o_v, m_v, 64).to(tl.float32)
        b_a = _load_rows(Aqk, t0, T, H * 64, c64, all64, 64)
        o_t = t0 + c64
        b_kgT = tl.load(KG + o_t[None, :] * sk + o_k[:, None], mask=m_k[:, None] & (o_t < T)[None, :], other=0.0)
        gam = tl.load(GAM + ((i_b * NT + n) * H + i_h).to(tl.int64) * K + o_k, mask=m_k, other=0.0)
        Sc = S.to(b_w.dtype)
        vn = b_u - tl.dot(b_w, Sc)
        vnc = vn.to(b_w.dtype)
        b_o = tl.dot(b_qg, Sc) + tl.dot(b_a, vnc)
        _store_rows(o, b_o, t0, T, sv, o_v, m_v, 64)
        if SAVE:
            _store_rows(vnew, vnc, t0, T, sv, o_v, m_v, 64)
        S = S * gam[:, None] + tl.dot(b_kgT, vnc)
    if STORE_HT:
        tl.store(ht + i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :], S, mask=m_kv)


@triton.jit
def _bwd_state_kernel(
    W, QG, KG, Aqk, GAM, do, dht, dhs, dvnew, dh0,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_DHT: tl.constexpr, USE_DH0: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    NT = (T + 63) // 64
    bt = i_b.to(tl.int64) * T * H + i_h
    W += bt * K
    QG += bt * K
    KG += bt * K
    do += bt * V
    dvnew += bt * V
    Aqk += bt * 64
    sk = H * K
    sv = H * V
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    c64 = tl.arange(0, 64)
    m_kv = m_k[:, None] & m_v[None, :]
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dS += tl.load(dht + i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
    for n in range(NT - 1, -1, -1):
        t0 = n * 64
        o_t = t0 + c64
        m_t = o_t < T
        p_dh = dhs + ((i_b * NT + n) * H + i_h).to(tl.int64) * K * V
        tl.store(p_dh + o_k[:, None] * V + o_v[None, :], dS.to(dhs.dtype.element_ty), mask=m_kv)
        b_qgT = tl.load(QG + o_t[None, :] * sk + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_wT = tl.load(W + o_t[None, :] * sk + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_kg = _load_rows(KG, t0, T, sk, o_k, m_k, 64)
        b_aT = tl.load(Aqk + o_t[None, :] * (H * 64) + c64[:, None], mask=m_t[None, :], other=0.0)
        b_do = _load_rows(do, t0, T, sv, o_v, m_v, 64)
        gam = tl.load(GAM + ((i_b * NT + n) * H + i_h).to(tl.int64) * K + o_k, mask=m_k, other=0.0)
        dvn = tl.dot(b_aT, b_do.to(b_aT.dtype)) + tl.dot(b_kg, dS.to(b_kg.dtype))
        dvnc = dvn.to(b_kg.dtype)
        _store_rows(dvnew, dvnc, t0, T, sv, o_v, m_v, 64)
        dS = dS * gam[:, None] + tl.dot(b_qgT, b_do.to(b_qgT.dtype)) - tl.dot(b_wT, dvnc)
    if USE_DH0:
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :], dS, mask=m_kv)


@triton.jit
def _pair_region(dq, dk, dG, db, dAs, qF, kF, bF, GF, p0, p16, p32, p48, scale, REGION: tl.constexpr,
                 shift: tl.constexpr, clamp: tl.constexpr, PAIR_BF16: tl.constexpr):
    """Adds the gradients of the pairwise products A_qk, A_kk restricted to one anchored region.

    dAs holds this chunk's dA_kk (columns 0–63) and dA_qk (columns 64–127), each row-major [64, 64].
    Every pair (r, j) of the region Mreg factors its decay as 2^{G_r − anc_r + shift} ·
    2^{anc_j − shift − G_j}, anc the region's anchor row for each position. Row side:
    R[r] = Σ_j P[r, j] k_j 2^{G_r − G_j} for P = dA_qk and P = dA_kk; column side:
    C[j] = Σ_r (dA_qk[r, j] scale q_r + β_r dA_kk[r, j] k_r) 2^{G_r − G_j}.
    PAIR_BF16: the four products take bf16 operands (fp32 accumulation) instead of tf32 ones.
    """
    c64 = tl.arange(0, 64)
    anc = _anchor(p0, p16, p32, p48, REGION)
    rf = tl.exp2(tl.minimum(GF - anc + shift, clamp))
    cf = tl.exp2(tl.minimum(anc - shift - GF, clamp))
    Y = kF * cf
    p_rc = dAs + c64[:, None] * 128 + c64[None, :]
    Mreg = _region_mask(REGION)
    if REGION == 0:
        # The main diagonal of A_qk (e^{G_r − G_r} = 1) is added exactly below, not through the
        # products: its two dG terms (row side at r, column side at r) cancel exactly, but through
        # tf32-rounded factors they leave an error of the diagonal's size, and under strong decay
        # the diagonal outweighs the true, decayed dG by e^{|g|} (dg 2.2e-2 vs fla's 2.6e-3).
        Mreg = Mreg & (c64[:, None] > c64[None, :])
        dqkd = tl.load(dAs + c64 * 129 + 64)[:, None] * scale  # dA_qk[r, r] · scale
        dq += dqkd * kF
        dk += dqkd * qF
    Pq = _pair_operand(tl.load(p_rc + 64, mask=Mreg, other=0.0), PAIR_BF16)
    Pk = _pair_operand(tl.load(p_rc, mask=Mreg, other=0.0), PAIR_BF16)
    Yo = _pair_operand(Y, PAIR_BF16)
    Rq = tl.dot(Pq, Yo) * rf
    Rk = tl.dot(Pk, Yo) * rf
    C = tl.dot(tl.trans(Pq), _pair_operand((qF * scale) * rf, PAIR_BF16))
    C = (tl.dot(tl.trans(Pk), _pair_operand((kF * bF) * rf, PAIR_BF16), C)) * cf
    dq += Rq * scale
    dk += bF * Rk + C
    dG += (qF * scale) * Rq + (kF * bF) * Rk - kF * C
    db += tl.sum(kF * Rk, 1)[:, None]
    return dq, dk, dG, db


@triton.jit
def _bwd_dA(TmT, bF, v, vnew, dvnew, do, dv, dAs, t0, T,
            H: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """dX = Tᵀ dV_new gives dv = β dX and, with V_new, dA_kk = −dX V_newᵀ; dA_qk = dO V_newᵀ.
    Stores dv and both dA (strictly lower / lower) into dAs; returns Σ_v dX ⊙ v [64, 1] (part of dβ)."""
    sv = H * V
    c64 = tl.arange(0, 64)
    dA = tl.zeros([64, 64], dtype=tl.float32)
    dAqk = tl.zeros([64, 64], dtype=tl.float32)
    db = tl.zeros([64, 1], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_dvn = _load_rows(dvnew, t0, T, sv, o_v, m_v, 64)
        b_vn = _load_rows(vnew, t0, T, sv, o_v, m_v, 64)
        b_do = _load_rows(do, t0, T, sv, o_v, m_v, 64).to(b_vn.dtype)
        dX = tl.dot(TmT, b_dvn)
        _store_rows(dv, dX * bF, t0, T, sv, o_v, m_v, 64)
        db += tl.sum(dX * _load_rows(v, t0, T, sv, o_v, m_v, 64).to(tl.float32), 1)[:, None]
        dA -= tl.dot(dX.to(b_vn.dtype), tl.trans(b_vn))
        dAqk += tl.dot(b_do, tl.trans(b_vn))
    p_rc = dAs + c64[:, None] * 128 + c64[None, :]
    tl.store(p_rc, tl.where(c64[:, None] > c64[None, :], dA, 0.0))
    tl.store(p_rc + 64, tl.where(c64[:, None] >= c64[None, :], dAqk, 0.0))
    return db


@triton.jit
def _bwd_value_products(TmT, hs, dhs, vnew, dvnew, do, t0, T, o_k, m_k,
                        H: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr):
    """One key slice's products over the value width: dQG = dO Sᵀ, dKG = V_new dS'ᵀ, dX Sᵀ, Σ S ⊙ dS'."""
    sv = H * V
    dqg = tl.zeros([64, BKS], dtype=tl.float32)
    dkg = tl.zeros([64, BKS], dtype=tl.float32)
    dXh = tl.zeros([64, BKS], dtype=tl.float32)
    dgam = tl.zeros([BKS], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_dvn = _load_rows(dvnew, t0, T, sv, o_v, m_v, 64)
        b_vn = _load_rows(vnew, t0, T, sv, o_v, m_v, 64)
        b_do = _load_rows(do, t0, T, sv, o_v, m_v, 64).to(b_vn.dtype)
        m_kv = m_k[:, None] & m_v[None, :]
        b_h = tl.load(hs + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
        b_dh = tl.load(dhs + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
        dXc = tl.dot(TmT, b_dvn).to(b_vn.dtype)
        dqg += tl.dot(b_do, tl.trans(b_h))
        dkg += tl.dot(b_vn, tl.trans(b_dh))
        dXh += tl.dot(dXc, tl.trans(b_h))
        dgam += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), 1)
    return dqg, dkg, dXh, dgam


@triton.jit
def _bwd_key_slice(q, k, Gs, dq, dk, dg, dAs, bF, dqg, dkg, dXh, dgam, db, scale, t0, T, o_k, m_k,
                   H: tl.constexpr, K: tl.constexpr, SHIFT: tl.constexpr, CLAMP: tl.constexpr,
                   PAIR_BF16: tl.constexpr):
    """dq, dk, dg of one key slice (stored) from its value-width products and the chunk's dA;
    returns db with this slice's share of dβ added."""
    sk = H * K
    c64 = tl.arange(0, 64)
    # ---- QG, KG, γ and the β e^G K S term of X -----------------------------------------------
    GF = _load_rows(Gs, t0, T, sk, o_k, m_k, 64)
    p0, p16, p32, p48, GC = _anchor_rows(Gs, t0, T, sk, o_k, m_k)
    qF = _load_rows(q, t0, T, sk, o_k, m_k, 64).to(tl.float32)
    kF = _load_rows(k, t0, T, sk, o_k, m_k, 64).to(tl.float32)
    eG = tl.exp2(GF)
    eGC = tl.exp2(GC[None, :] - GF)
    b_dq = dqg * eG * scale
    b_dk = dkg * eGC - bF * eG * dXh
    b_dG = (qF * scale * eG) * dqg - (kF * eGC) * dkg - (bF * kF * eG) * dXh
    dGC = tl.sum((kF * eGC) * dkg, 0) + tl.exp2(GC) * dgam
    db -= tl.sum((kF * eG) * dXh, 1)[:, None]

    # ---- pairwise terms: three anchored regions partition the lower triangle -----------------
    b_dq, b_dk, b_dG, db = _pair_region(b_dq, b_dk, b_dG, db, dAs, qF, kF, bF, GF,
                                        p0, p16, p32, p48, scale, 0, SHIFT, CLAMP, PAIR_BF16)
    b_dq, b_dk, b_dG, db = _pair_region(b_dq, b_dk, b_dG, db, dAs, qF, kF, bF, GF,
                                        p0, p16, p32, p48, scale, 1, 0.0, 0.0, PAIR_BF16)
    b_dq, b_dk, b_dG, db = _pair_region(b_dq, b_dk, b_dG, db, dAs, qF, kF, bF, GF,
                                        p0, p16, p32, p48, scale, 2, 0.0, 0.0, PAIR_BF16)

    # G_C enters through γ and KG: its gradient lands on the last row, then dg = reverse cumsum.
    b_dG += tl.where(c64[:, None] == 63, dGC[None, :], 0.0)
    _store_rows(dq, b_dq, t0, T, sk, o_k, m_k, 64)
    _store_rows(dk, b_dk, t0, T, sk, o_k, m_k, 64)
    _store_rows(dg, tl.cumsum(b_dG, 0, reverse=True), t0, T, sk, o_k, m_k, 64)
    return db


@triton.jit
def _bwd_chunk_kernel(
    q, k, v, Gs, beta, Ti, hs, dhs, vnew, dvnew, do, dAs,
    dq, dk, dv, dg, dbeta,
    scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BKS: tl.constexpr, BV: tl.constexpr,
    SHIFT: tl.constexpr, CLAMP: tl.constexpr, PAIR_BF16: tl.constexpr,
):
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    NT = (T + 63) // 64
    t0 = i_t * 64
    bt = i_b.to(tl.int64) * T * H + i_h
    q += bt * K
    k += bt * K
    Gs += bt * K
    dq += bt * K
    dk += bt * K
    dg += bt * K
    v += bt * V
    vnew += bt * V
    dvnew += bt * V
    do += bt * V
    dv += bt * V
    beta += bt
    dbeta += bt
    Ti += bt * 64
    i_chunk = ((i_b * NT + i_t) * H + i_h).to(tl.int64)
    hs += i_chunk * K * V
    dhs += i_chunk * K * V
    dAs += i_chunk * 64 * 128
    c64 = tl.arange(0, 64)
    one = tl.full([1], 1, dtype=tl.int1)
    zero_c = tl.zeros([1], dtype=tl.int32)

    # Tᵀ, read transposed from memory: tl.trans of a register tile as the left dot operand
    # miscompiles on Hopper with Triton 3.6 (an out-of-bounds shared-memory read, seen on the H200).
    o_t = t0 + c64
    TmT = tl.load(Ti + o_t[None, :] * (H * 64) + c64[:, None], mask=(o_t < T)[None, :], other=0.0)
    bF = _load_rows(beta, t0, T, H, zero_c, one, 64).to(tl.float32)  # [64, 1]
    db = _bwd_dA(TmT, bF, v, vnew, dvnew, do, dv, dAs, t0, T, H, V, BV)
    # The pair gradients read dA back in other layouts (and transposed): make the stores visible.
    tl.debug_barrier()
    for i_k in range(tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = o_k < K
        dqg, dkg, dXh, dgam = _bwd_value_products(TmT, hs, dhs, vnew, dvnew, do, t0, T, o_k, m_k,
                                                  H, V, BKS, BV)
        db = _bwd_key_slice(q, k, Gs, dq, dk, dg, dAs, bF, dqg, dkg, dXh, dgam, db, scale, t0, T,
                            o_k, m_k, H, K, SHIFT, CLAMP, PAIR_BF16)
    _store_rows(dbeta, db, t0, T, H, zero_c, one, 64)


@triton.jit
def _bwd_values_kernel(
    v, beta, Ti, hs, dhs, vnew, dvnew, do,
    dv, dAs, dQG, dKG, dXH, dGAM, DB,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BKS: tl.constexpr, BV: tl.constexpr,
):
    """Split backward, part 1: everything over the value width. dv; dA_kk, dA_qk → dAs; per key
    slice dQG, dKG, dX Sᵀ → fp32 scratch [B, T, H, K], Σ S ⊙ dS' → dGAM [B, NT, H, K]; Σ dX ⊙ v → DB."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    NT = (T + 63) // 64
    t0 = i_t * 64
    bt = i_b.to(tl.int64) * T * H + i_h
    v += bt * V
    vnew += bt * V
    dvnew += bt * V
    do += bt * V
    dv += bt * V
    beta += bt
    DB += bt
    Ti += bt * 64
    dQG += bt * K
    dKG += bt * K
    dXH += bt * K
    i_chunk = ((i_b * NT + i_t) * H + i_h).to(tl.int64)
    hs += i_chunk * K * V
    dhs += i_chunk * K * V
    dAs += i_chunk * 64 * 128
    dGAM += i_chunk * K
    sk = H * K
    c64 = tl.arange(0, 64)
    one = tl.full([1], 1, dtype=tl.int1)
    zero_c = tl.zeros([1], dtype=tl.int32)

    # Tᵀ read transposed from memory, as in _bwd_chunk_kernel (tl.trans miscompiles there).
    o_t = t0 + c64
    TmT = tl.load(Ti + o_t[None, :] * (H * 64) + c64[:, None], mask=(o_t < T)[None, :], other=0.0)
    bF = _load_rows(beta, t0, T, H, zero_c, one, 64).to(tl.float32)  # [64, 1]
    db = _bwd_dA(TmT, bF, v, vnew, dvnew, do, dv, dAs, t0, T, H, V, BV)
    _store_rows(DB, db, t0, T, H, zero_c, one, 64)
    for i_k in range(tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = o_k < K
        dqg, dkg, dXh, dgam = _bwd_value_products(TmT, hs, dhs, vnew, dvnew, do, t0, T, o_k, m_k,
                                                  H, V, BKS, BV)
        _store_rows(dQG, dqg, t0, T, sk, o_k, m_k, 64)
        _store_rows(dKG, dkg, t0, T, sk, o_k, m_k, 64)
        _store_rows(dXH, dXh, t0, T, sk, o_k, m_k, 64)
        tl.store(dGAM + o_k, dgam, mask=m_k)


@triton.jit
def _bwd_pairs_kernel(
    q, k, Gs, beta, dAs, dQG, dKG, dXH, dGAM, DB,
    dq, dk, dg, dbeta,
    scale, T,
    H: tl.constexpr, K: tl.constexpr, BKS: tl.constexpr,
    SHIFT: tl.constexpr, CLAMP: tl.constexpr, PAIR_BF16: tl.constexpr,
):
    """Split backward, part 2: the QG / KG / γ terms and the three anchored pair regions from
    part 1's scratch; writes dq, dk, dg and dβ."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    NT = (T + 63) // 64
    t0 = i_t * 64
    bt = i_b.to(tl.int64) * T * H + i_h
    q += bt * K
    k += bt * K
    Gs += bt * K
    dq += bt * K
    dk += bt * K
    dg += bt * K
    dQG += bt * K
    dKG += bt * K
    dXH += bt * K
    beta += bt
    DB += bt
    dbeta += bt
    i_chunk = ((i_b * NT + i_t) * H + i_h).to(tl.int64)
    dAs += i_chunk * 64 * 128
    dGAM += i_chunk * K
    sk = H * K
    one = tl.full([1], 1, dtype=tl.int1)
    zero_c = tl.zeros([1], dtype=tl.int32)
    bF = _load_rows(beta, t0, T, H, zero_c, one, 64).to(tl.float32)  # [64, 1]
    db = _load_rows(DB, t0, T, H, zero_c, one, 64)
    for i_k in range(tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = o_k < K
        dqg = _load_rows(dQG, t0, T, sk, o_k, m_k, 64)
        dkg = _load_rows(dKG, t0, T, sk, o_k, m_k, 64)
        dXh = _load_rows(dXH, t0, T, sk, o_k, m_k, 64)
        dgam = tl.load(dGAM + o_k, mask=m_k, other=0.0)
        db = _bwd_key_slice(q, k, Gs, dq, dk, dg, dAs, bF, dqg, dkg, dXh, dgam, db, scale, t0, T,
                            o_k, m_k, H, K, SHIFT, CLAMP, PAIR_BF16)
    _store_rows(dbeta, db, t0, T, H, zero_c, one, 64)


# --------------------------------------------------------------------------------------------
# Host functions
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Launch shapes and kernel variants (benchmarks/kda.py and benchmarks/kda_variants.py sweep
    them). The defaults are the fastest correct variant of the H200 sweeps of 2026-11-29: split prep
    with the substitution inverse in one tf32 pass (the pairs kernel at 4 warps, session 4's
    `subst_combined_pairs4`: forward 2.19 vs 2.61 ms with 8), split backward; 7.92 ms forward+backward
    at (8, 4096, 16, 128) against 10.78 ms for `FUSED_DOUBLING` (benchmarks/results/
    kda_variants_pairs4_h200.json, kda_variants_h200.json, docs/log/kda.md). With the diagonal
    substitutions in one loop (session 6): forward 1.89 ms, forward+backward 7.65 ms
    (kda_variants_diag4_h200.json)."""

    # 4 warps miscompiles the fused prep kernel (H200, Triton 3.6); the split kernels are separate.
    prep_warps: int = 8
    prep_key_slice: int = 32
    state_warps: int = 8
    state_stages: int = 2
    state_block_v: int = 0  # 0: 64 when batch·heads ≥ 64, else 32 (more programs for the serial loop)
    bwd_warps: int = 8
    bwd_key_slice: int = 32
    # 8 warps with 32-wide value blocks miscompiles (out-of-bounds shared read, H200, Triton 3.6)
    bwd_block_v: int = 64
    # The inverse's products (either inverse): "tf32x3" (about fp32) or "tf32" (one pass, a third of
    # the tensor-core work; T is stored in the input dtype afterwards, whose rounding is larger). tf32
    # is safe for the substitution in every regime (tests/kernels/kda/test_inverse_precision.py).
    inverse_precision: str = "tf32"
    # "substitution" (default): forward substitution in the 16-blocks and a block merge, as fla's
    # solve_tril; or "doubling", (I − A)(I + A²)⋯(I + A³²) in the fused prep kernel — the
    # configuration timed on the H200 on 2026-11-29, but it cancels catastrophically when A_kk is
    # large and of one sign (correlated keys, weak decay), which trained models do produce (a tiny
    # checkpoint's third KDA layer: NaN / 8–80× relative error in the torch twin; docs/log/kda.md).
    # The substitution reads rows of β ⊙ A_kk from the split prep's scratch, so it needs prep_split.
    inverse: str = "substitution"
    # Prep as two kernels, fewer live registers each: G, QG, KG, γ, A_qk and β ⊙ A_kk (to fp32
    # scratch), then the inverse, W and U.
    prep_split: bool = True
    prep_pairs_warps: int = 4
    # With the doubling inverse, a 4-warp solve kernel gave dh0 74 % off on the H200 (Triton 3.6; the
    # session-3 sweep); the substitution solve at 4 warps passes every GPU test.
    prep_solve_warps: int = 4
    # Backward chunk as two kernels: the value-width products (dv, dA, dQG, dKG, dX Sᵀ to fp32
    # scratch), then the QG / KG / γ terms and the anchored pair regions (dq, dk, dg, dβ).
    bwd_split: bool = True
    bwd_values_warps: int = 4
    bwd_pairs_warps: int = 8
    # The pair-region products of the split prep (_region_products: A_qk, A_kk) and of the backward
    # (_pair_region): "fp32" operands (tf32 tensor-core products, Triton's default) or "bf16"
    # operands with fp32 accumulation (session 6; untimed).
    prep_pair_dtype: str = "fp32"
    bwd_pair_dtype: str = "fp32"

    def __post_init__(self):
        if self.inverse_precision not in ("tf32x3", "tf32"):
            raise ValueError(f"inverse_precision must be 'tf32x3' or 'tf32', got {self.inverse_precision!r}")
        for name in ("prep_pair_dtype", "bwd_pair_dtype"):
            if getattr(self, name) not in ("fp32", "bf16"):
                raise ValueError(f"{name} must be 'fp32' or 'bf16', got {getattr(self, name)!r}")
        if self.prep_pair_dtype == "bf16" and not self.prep_split:
            raise ValueError("prep_pair_dtype='bf16' is a switch of the split prep: set prep_split=True")
        if self.inverse not in ("doubling", "substitution"):
            raise ValueError(f"inverse must be 'doubling' or 'substitution', got {self.inverse!r}")
        if self.inverse == "substitution" and not self.prep_split:
            raise ValueError("inverse='substitution' reads A_kk from the split prep's scratch: set prep_split=True")
        warps = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name.endswith("_warps")}
        bad = {n: w for n, w in warps.items() if w not in (1, 2, 4, 8, 16)}
        if bad:
            raise ValueError(f"warp counts must be 1, 2, 4, 8 or 16, got {bad}")


_TILES = TileConfig()
# The fused prep kernel with the doubling inverse: timed on the H200 (2026-11-29), unstable when A_kk
# is large and of one sign (correlated keys, weak decay).
FUSED_DOUBLING = TileConfig(prep_split=False, inverse="doubling", inverse_precision="tf32x3", bwd_split=False)


def set_tile_config(cfg: TileConfig) -> TileConfig:
    """Replace the launch shapes; returns the previous ones."""
    global _TILES
    old, _TILES = _TILES, cfg
    return old


def _check_supported(q, v) -> None:
    K, V = q.shape[-1], v.shape[-1]
    if K > MAX_K or K < 16:
        raise ValueError(f"the Triton KDA kernels take key width 16 ≤ K ≤ {MAX_K}, got K={K}; "
                         "use backend='torch' for other widths")
    if V > MAX_V or V < 16:
        raise ValueError(f"the Triton KDA kernels take value width 16 ≤ V ≤ {MAX_V}, got V={V}; "
                         "use backend='torch' for other widths")
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"the Triton KDA kernels take bf16, fp16 or fp32 inputs, got {q.dtype}")


def _pow2_tile(n: int, cap: int) -> int:
    return min(cap, max(16, triton.next_power_of_2(n)))


def _state_block(V: int, B: int, H: int) -> int:
    # Few (batch·head) programs leave SMs idle during the serial chunk loop: split V finer then.
    bv = _TILES.state_block_v or (64 if B * H >= 64 else 32)
    return _pow2_tile(V, bv)


def _state_stages(x: torch.Tensor) -> int:
    # fp32 chunk tiles double the pipelined buffers: at K = 128 two stages need 304 KB of shared
    # memory (the H200 has 227 KB per CTA), so fp32 inputs stream the state kernels' loads unbuffered.
    return _TILES.state_stages if x.element_size() <= 2 else 1


def kda_prepare(q, k, v, g, beta, scale):
    """Kernel 1 (two kernels with TileConfig.prep_split): per-chunk G, T, A_qk, W, U, QG, KG and γ
    (see the module docstring)."""
    if _TILES.prep_split:
        Gs, Akk, Aqk, QG, KG, GAM = kda_prepare_pairs(q, k, g, beta, scale)
        Ti, W, U = kda_prepare_solve(k, v, beta, Gs, Akk)
        return Gs, Ti, Aqk, W, U, QG, KG, GAM
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    dt = q.dtype
    Gs = torch.empty(B, T, H, K, device=q.device, dtype=torch.float32)  # scratch: G in log2 units
    Ti = torch.empty(B, T, H, CHUNK, device=q.device, dtype=dt)
    Aqk = torch.empty(B, T, H, CHUNK, device=q.device, dtype=dt)
    W = torch.empty(B, T, H, K, device=q.device, dtype=dt)
    U = torch.empty(B, T, H, V, device=q.device, dtype=dt)
    QG = torch.empty_like(W)
    KG = torch.empty_like(W)
    GAM = torch.empty(B, NT, H, K, device=q.device, dtype=torch.float32)
    _prep_kernel[(NT, B * H)](
        q, k, v, g, beta, Gs, Ti, Aqk, W, U, QG, KG, GAM, scale, T,
        H=H, K=K, V=V, BKS=_pow2_tile(K, _TILES.prep_key_slice), BV=_pow2_tile(V, 128),
        SHIFT=DIAG_SHIFT, CLAMP=EXP2_CLAMP, INV_PREC=_TILES.inverse_precision,
        num_warps=_TILES.prep_warps, num_stages=1,
    )
    return Gs, Ti, Aqk, W, U, QG, KG, GAM


def kda_prepare_pairs(q, k, g, beta, scale):
    """Split prep, part 1: G (log2 units), β ⊙ A_kk (fp32 scratch), A_qk, QG, KG and γ."""
    B, T, H, K = q.shape
    NT = triton.cdiv(T, CHUNK)
    Gs = torch.empty(B, T, H, K, device=q.device, dtype=torch.float32)
    Akk = torch.empty(B, T, H, CHUNK, device=q.device, dtype=torch.float32)
    Aqk = torch.empty(B, T, H, CHUNK, device=q.device, dtype=q.dtype)
    QG = torch.empty_like(q)
    KG = torch.empty_like(q)
    GAM = torch.empty(B, NT, H, K, device=q.device, dtype=torch.float32)
    _prep_pairs_kernel[(NT, B * H)](
        q, k, g, beta, Gs, Akk, Aqk, QG, KG, GAM, scale, T,
        H=H, K=K, BKS=_pow2_tile(K, _TILES.prep_key_slice), SHIFT=DIAG_SHIFT, CLAMP=EXP2_CLAMP,
        PAIR_BF16=_TILES.prep_pair_dtype == "bf16", num_warps=_TILES.prep_pairs_warps, num_stages=1,
    )
    return Gs, Akk, Aqk, QG, KG, GAM


def kda_prepare_solve(k, v, beta, Gs, Akk):
    """Split prep, part 2: T = (I + β ⊙ A_kk)⁻¹, W and U."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    Ti = torch.empty(B, T, H, CHUNK, device=k.device, dtype=k.dtype)
    W = torch.empty_like(k)
    U = torch.empty_like(v)
    _prep_solve_kernel[(NT, B * H)](
        k, v, beta, Gs, Akk, Ti, W, U, T,
        H=H, K=K, V=V, BKS=_pow2_tile(K, _TILES.prep_key_slice), BV=_pow2_tile(V, 128),
        INV_PREC=_TILES.inverse_precision, SUBSTITUTION=_TILES.inverse == "substitution",
        num_warps=_TILES.prep_solve_warps, num_stages=1,
    )
    return Ti, W, U


def kda_state_forward(W, U, QG, KG, Aqk, GAM, initial_state, output_final_state, save):
    """Kernel 2: the serial hand-off with the output fused in; optionally keeps S per chunk and V_new."""
    B, T, H, K = W.shape
    V = U.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    o = torch.empty(B, T, H, V, device=W.device, dtype=W.dtype)
    ht = torch.empty(B, H, K, V, device=W.device, dtype=torch.float32) if output_final_state else None
    hs = torch.empty(B, NT, H, K, V, device=W.device, dtype=W.dtype) if save else None
    vnew = torch.empty_like(U) if save else None
    BV = _state_block(V, B, H)
    _fwd_state_kernel[(triton.cdiv(V, BV), B * H)](
        W, U, QG, KG, Aqk, GAM, initial_state, o, ht, hs, vnew, T,
        H=H, K=K, V=V, BK=_pow2_tile(K, MAX_K), BV=BV,
        USE_H0=initial_state is not None, STORE_HT=output_final_state, SAVE=save,
        num_warps=_TILES.state_warps, num_stages=_state_stages(W),
    )
    return o, ht, hs, vnew


def kda_state_backward(W, QG, KG, Aqk, GAM, do, dht, need_dh0):
    """Kernel 3: reverse serial pass; dS' per chunk (bf16), dV_new, and dS_0 when asked."""
    B, T, H, K = W.shape
    V = do.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    dhs = torch.empty(B, NT, H, K, V, device=W.device, dtype=W.dtype)
    dvnew = torch.empty(B, T, H, V, device=W.device, dtype=W.dtype)
    dh0 = torch.empty(B, H, K, V, device=W.device, dtype=torch.float32) if need_dh0 else None
    BV = _state_block(V, B, H)
    _bwd_state_kernel[(triton.cdiv(V, BV), B * H)](
        W, QG, KG, Aqk, GAM, do, dht, dhs, dvnew, dh0, T,
        H=H, K=K, V=V, BK=_pow2_tile(K, MAX_K), BV=BV,
        USE_DHT=dht is not None, USE_DH0=need_dh0, num_warps=_TILES.state_warps,
        num_stages=_state_stages(W),
    )
    return dhs, dvnew, dh0


def kda_chunk_backward(q, k, v, g, Gs, beta, Ti, hs, dhs, vnew, dvnew, do, scale):
    """Kernel 4 (two kernels with TileConfig.bwd_split): dq, dk, dv, dg, dβ from the stored chunk
    quantities."""
    if _TILES.bwd_split:
        dv, dAs, dQG, dKG, dXH, dGAM, DB = kda_chunk_backward_values(v, beta, Ti, hs, dhs, vnew, dvnew, do)
        dq, dk, dg, dbeta = kda_chunk_backward_pairs(q, k, g, Gs, beta, dAs, dQG, dKG, dXH, dGAM, DB, scale)
        return dq, dk, dv, dg, dbeta
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dg = torch.empty_like(g)
    dbeta = torch.empty_like(beta)
    dAs = torch.empty(B, NT, H, CHUNK, 2 * CHUNK, device=q.device, dtype=torch.float32)  # scratch
    _bwd_chunk_kernel[(NT, B * H)](
        q, k, v, Gs, beta, Ti, hs, dhs, vnew, dvnew, do, dAs, dq, dk, dv, dg, dbeta, scale, T,
        H=H, K=K, V=V, BKS=_pow2_tile(K, _TILES.bwd_key_slice), BV=_pow2_tile(V, _TILES.bwd_block_v),
        SHIFT=DIAG_SHIFT, CLAMP=EXP2_CLAMP, PAIR_BF16=_TILES.bwd_pair_dtype == "bf16", num_warps=_TILES.bwd_warps,
        num_stages=1,
    )
    return dq, dk, dv, dg, dbeta


def kda_chunk_backward_values(v, beta, Ti, hs, dhs, vnew, dvnew, do):
    """Split backward, part 1: dv, and fp32 scratch dA [B, NT, H, 64, 128], dQG, dKG, dX Sᵀ
    [B, T, H, K], Σ S ⊙ dS' [B, NT, H, K] and Σ dX ⊙ v [B, T, H]."""
    B, NT, H, K, V = hs.shape
    T = v.shape[1]
    f32 = dict(device=v.device, dtype=torch.float32)
    dv = torch.empty_like(v)
    dAs = torch.empty(B, NT, H, CHUNK, 2 * CHUNK, **f32)
    dQG = torch.empty(B, T, H, K, **f32)
    dKG = torch.empty(B, T, H, K, **f32)
    dXH = torch.empty(B, T, H, K, **f32)
    dGAM = torch.empty(B, NT, H, K, **f32)
    DB = torch.empty(B, T, H, **f32)
    _bwd_values_kernel[(NT, B * H)](
        v, beta, Ti, hs, dhs, vnew, dvnew, do, dv, dAs, dQG, dKG, dXH, dGAM, DB, T,
        H=H, K=K, V=V, BKS=_pow2_tile(K, _TILES.bwd_key_slice), BV=_pow2_tile(V, _TILES.bwd_block_v),
        num_warps=_TILES.bwd_values_warps, num_stages=1,
    )
    return dv, dAs, dQG, dKG, dXH, dGAM, DB


def kda_chunk_backward_pairs(q, k, g, Gs, beta, dAs, dQG, dKG, dXH, dGAM, DB, scale):
    """Split backward, part 2: dq, dk, dg, dβ from part 1's scratch."""
    B, T, H, K = q.shape
    NT = triton.cdiv(T, CHUNK)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dg = torch.empty_like(g)
    dbeta = torch.empty_like(beta)
    _bwd_pairs_kernel[(NT, B * H)](
        q, k, Gs, beta, dAs, dQG, dKG, dXH, dGAM, DB, dq, dk, dg, dbeta, scale, T,
        H=H, K=K, BKS=_pow2_tile(K, _TILES.bwd_key_slice), SHIFT=DIAG_SHIFT, CLAMP=EXP2_CLAMP,
        PAIR_BF16=_TILES.bwd_pair_dtype == "bf16", num_warps=_TILES.bwd_pairs_warps, num_stages=1,
    )
    return dq, dk, dg, dbeta


# --------------------------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------------------------


class ChunkKDATriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state):
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        h0 = initial_state.contiguous().float() if initial_state is not None else None
        save = any(ctx.needs_input_grad)
        Gs, Ti, Aqk, W, U, QG, KG, GAM = kda_prepare(q, k, v, g, beta, scale)
        o, ht, hs, vnew = kda_state_forward(W, U, QG, KG, Aqk, GAM, h0, output_final_state, save)
        if save:
            ctx.save_for_backward(q, k, v, g, Gs, beta, Ti, Aqk, W, QG, KG, GAM, hs, vnew)
            ctx.scale = scale
            ctx.has_h0 = h0 is not None
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, Gs, beta, Ti, Aqk, W, QG, KG, GAM, hs, vnew = ctx.saved_tensors
        do = do.contiguous().to(q.dtype)
        dht = dht.contiguous().float() if dht is not None else None
        dhs, dvnew, dh0 = kda_state_backward(W, QG, KG, Aqk, GAM, do, dht, ctx.has_h0)
        dq, dk, dv, dg, dbeta = kda_chunk_backward(q, k, v, g, Gs, beta, Ti, hs, dhs, vnew, dvnew, do, ctx.scale)
        return dq, dk, dv, dg, dbeta, None, dh0, None


def chunk_kda_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise KDA through the Triton kernels (CUDA, or the CPU under TRITON_INTERPRET=1).

    Same signature and conventions as `naive_recurrent_kda`: q, k, g `[B, T, H, K]`, v `[B, T, H, V]`,
    beta `[B, T, H]`, states `[B, H, K, V]` fp32, `g` the per-token log decay. Returns (o in q's dtype,
    final state fp32 or None). Differentiable in q, k, v, g, beta and the initial state.
    Limits (ValueError otherwise): 16 ≤ K ≤ 128, 16 ≤ V ≤ 256, bf16/fp16/fp32 inputs.
    """
    from kernels.kda.naive import check_kda_inputs

    check_kda_inputs(q, k, v, g, beta, initial_state)
    _check_supported(q, v)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return ChunkKDATriton.apply(q, k, v, g, beta, scale, initial_state, output_final_state)
