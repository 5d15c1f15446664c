"""Stage 1 of the Triton KDA forward (parallel over chunks): G, QG, KG, γ, A_qk and β ⊙ A_kk.

Per chunk: G = the chunk-local cumulative log decay in log2 units (kept for the backward),
KG = K ⊙ 2^{G_C − G}, QG = scale · Q ⊙ 2^G, γ = 2^{G_C}, and A_qk, A_kk on full 64-row tiles through
tensor-core products over the three anchored pair regions (`kernels/kda/chunk_triton.py`); β ⊙ A_kk
goes to fp32 scratch for the solve. One kernel at 4 warps: with the inverse in the same kernel it
needed 8 warps at 255 registers (one CTA per SM), split it runs 2 CTAs per SM (docs/log/kda.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kda.triton.common import (
    CHUNK, DIAG_SHIFT, EXP2_CLAMP, TileConfig, _anchor, _anchor_rows, _chunk_program, _load_rows, _region_mask,
    _store_rows, pow2_tile,
)


@triton.jit
def _region_products(acc_qk, acc_kk, qF, kF, GF, p0, p16, p32, p48, REGION: tl.constexpr,
                     shift: tl.constexpr, clamp: tl.constexpr):
    """Adds (Q Kᵀ, K Kᵀ) with decay 2^{G_r − G_j} inside one pair region (tf32 products)."""
    anc = _anchor(p0, p16, p32, p48, REGION)
    rf = tl.exp2(tl.minimum(GF - anc + shift, clamp))
    kc = tl.trans(kF * tl.exp2(tl.minimum(anc - shift - GF, clamp)))
    M = _region_mask(REGION)
    acc_qk += tl.where(M, tl.dot(qF * rf, kc), 0.0)
    acc_kk += tl.where(M, tl.dot(kF * rf, kc), 0.0)
    return acc_qk, acc_kk


@triton.jit
def _prep_pairs(q, k, g, beta, Gs, Aqk, QG, KG, GAM, scale, t0, T,
                H: tl.constexpr, K: tl.constexpr, BKS: tl.constexpr,
                SHIFT: tl.constexpr, CLAMP: tl.constexpr):
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
        acc_qk, acc_kk = _region_products(acc_qk, acc_kk, qF, kF, GF, p0, p16, p32, p48, 0, SHIFT, CLAMP)
        acc_qk, acc_kk = _region_products(acc_qk, acc_kk, qF, kF, GF, p0, p16, p32, p48, 1, 0.0, 0.0)
        acc_qk, acc_kk = _region_products(acc_qk, acc_kk, qF, kF, GF, p0, p16, p32, p48, 2, 0.0, 0.0)
    bF = _load_rows(beta, t0, T, H, zc, one, 64).to(tl.float32)  # [64, 1]
    acc_qk = tl.where(c64[:, None] >= c64[None, :], acc_qk * scale, 0.0)
    _store_rows(Aqk, acc_qk, t0, T, H * 64, c64, all64, 64)
    return tl.where(c64[:, None] > c64[None, :], acc_kk * bF, 0.0), bF


@triton.jit
def _prep_pairs_kernel(
    q, k, g, beta,
    Gs, Akk, Aqk, QG, KG, GAM,
    scale, T,
    H: tl.constexpr, K: tl.constexpr, BKS: tl.constexpr,
    SHIFT: tl.constexpr, CLAMP: tl.constexpr,
):
    """`_prep_pairs`, with β ⊙ A_kk going to fp32 scratch `Akk` [B, T, H, 64]."""
    t0, bt, i_chunk = _chunk_program(T, H)
    q += bt * K
    k += bt * K
    g += bt * K
    Gs += bt * K
    beta += bt
    Akk += bt * 64
    Aqk += bt * 64
    QG += bt * K
    KG += bt * K
    GAM += i_chunk * K
    c64 = tl.arange(0, 64)
    A, bF = _prep_pairs(q, k, g, beta, Gs, Aqk, QG, KG, GAM, scale, t0, T, H, K, BKS, SHIFT, CLAMP)
    _store_rows(Akk, A, t0, T, H * 64, c64, c64 < 64, 64)


def kda_prepare_pairs(q, k, g, beta, scale, tiles: TileConfig):
    """G (log2 units), β ⊙ A_kk (fp32 scratch), A_qk, QG, KG and γ."""
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
        H=H, K=K, BKS=pow2_tile(K, tiles.prep_key_slice), SHIFT=DIAG_SHIFT, CLAMP=EXP2_CLAMP,
        num_warps=tiles.prep_pairs_warps, num_stages=1,
    )
    return Gs, Akk, Aqk, QG, KG, GAM
