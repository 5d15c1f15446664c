"""Stage 6 of the Triton KDA kernels (parallel over chunks): dq, dk, dv, dg, dβ from the stored chunk
quantities and the reverse pass's dS' and dV_new.

With X = β(V − 2^G K S) so that V_new = T X: dX = Tᵀ dV_new and dA_kk = −dX V_newᵀ (strictly lower),
which needs neither W nor dT; then the gradients of QG, KG, γ and of the pairwise matrices A_qk and
A_kk with respect to q, k, G and β, over the same three anchored regions as the prep; dg is the
reverse cumulative sum of dG over the chunk. Two kernels: the value-width products
(`_bwd_values_kernel`, 4 warps: dv, dA, dQG, dKG, dX Sᵀ to fp32 scratch), then the pair regions
(`_bwd_pairs_kernel`, 8 warps); as one kernel it ran 8 warps at 255 registers with 680 B of spill,
1.2 ms slower at (8, 4096, 16, 128) on the H200 (docs/log/kda.md).
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
def _pair_region(dq, dk, dG, db, dAs, qF, kF, bF, GF, p0, p16, p32, p48, scale, REGION: tl.constexpr,
                 shift: tl.constexpr, clamp: tl.constexpr):
    """Adds the gradients of the pairwise products A_qk, A_kk restricted to one anchored region.

    dAs holds this chunk's dA_kk (columns 0–63) and dA_qk (columns 64–127), each row-major [64, 64].
    Every pair (r, j) of the region Mreg factors its decay as 2^{G_r − anc_r + shift} ·
    2^{anc_j − shift − G_j}, anc the region's anchor row for each position. Row side:
    R[r] = Σ_j P[r, j] k_j 2^{G_r − G_j} for P = dA_qk and P = dA_kk; column side:
    C[j] = Σ_r (dA_qk[r, j] scale q_r + β_r dA_kk[r, j] k_r) 2^{G_r − G_j}.
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
    Pq = tl.load(p_rc + 64, mask=Mreg, other=0.0)
    Pk = tl.load(p_rc, mask=Mreg, other=0.0)
    Rq = tl.dot(Pq, Y) * rf
    Rk = tl.dot(Pk, Y) * rf
    C = tl.dot(tl.trans(Pq), (qF * scale) * rf)
    C = (tl.dot(tl.trans(Pk), (kF * bF) * rf, C)) * cf
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
                   H: tl.constexpr, K: tl.constexpr, SHIFT: tl.constexpr, CLAMP: tl.constexpr):
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
                                        p0, p16, p32, p48, scale, 0, SHIFT, CLAMP)
    b_dq, b_dk, b_dG, db = _pair_region(b_dq, b_dk, b_dG, db, dAs, qF, kF, bF, GF,
                                        p0, p16, p32, p48, scale, 1, 0.0, 0.0)
    b_dq, b_dk, b_dG, db = _pair_region(b_dq, b_dk, b_dG, db, dAs, qF, kF, bF, GF,
                                        p0, p16, p32, p48, scale, 2, 0.0, 0.0)

    # G_C enters through γ and KG: its gradient lands on the last row, then dg = reverse cumsum.
    b_dG += tl.where(c64[:, None] == 63, dGC[None, :], 0.0)
    _store_rows(dq, b_dq, t0, T, sk, o_k, m_k, 64)
    _store_rows(dk, b_dk, t0, T, sk, o_k, m_k, 64)
    _store_rows(dg, tl.cumsum(b_dG, 0, reverse=True), t0, T, sk, o_k, m_k, 64)
    return db


@triton.jit
def _bwd_values_kernel(
    v, beta, Ti, hs, dhs, vnew, dvnew, do,
    dv, dAs, dQG, dKG, dXH, dGAM, DB,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BKS: tl.constexpr, BV: tl.constexpr,
):
    """Part 1: everything over the value width. dv; dA_kk, dA_qk → dAs; per key
    slice dQG, dKG, dX Sᵀ → fp32 scratch [B, T, H, K], Σ S ⊙ dS' → dGAM [B, NT, H, K]; Σ dX ⊙ v → DB."""
    t0, bt, i_chunk = _chunk_program(T, H)
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
    hs += i_chunk * K * V
    dhs += i_chunk * K * V
    dAs += i_chunk * 64 * 128
    dGAM += i_chunk * K
    sk = H * K
    c64 = tl.arange(0, 64)
    one = tl.full([1], 1, dtype=tl.int1)
    zero_c = tl.zeros([1], dtype=tl.int32)

    # Tᵀ, read transposed from memory: tl.trans of a register tile as the left dot operand
    # miscompiled on Hopper with Triton 3.6 (an out-of-bounds shared-memory read, seen on the H200).
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
    SHIFT: tl.constexpr, CLAMP: tl.constexpr,
):
    """Part 2: the QG / KG / γ terms and the three anchored pair regions from
    part 1's scratch; writes dq, dk, dg and dβ."""
    t0, bt, i_chunk = _chunk_program(T, H)
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
                            o_k, m_k, H, K, SHIFT, CLAMP)
    _store_rows(dbeta, db, t0, T, H, zero_c, one, 64)


def kda_chunk_backward(q, k, v, g, Gs, beta, Ti, hs, dhs, vnew, dvnew, do, scale, tiles: TileConfig):
    """dq, dk, dv, dg, dβ. Scratch between the two kernels (fp32): dA [B, NT, H, 64, 128], dQG, dKG,
    dX Sᵀ [B, T, H, K], Σ S ⊙ dS' [B, NT, H, K] and Σ dX ⊙ v [B, T, H]."""
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
    bks = pow2_tile(K, tiles.bwd_key_slice)
    _bwd_values_kernel[(NT, B * H)](
        v, beta, Ti, hs, dhs, vnew, dvnew, do, dv, dAs, dQG, dKG, dXH, dGAM, DB, T,
        H=H, K=K, V=V, BKS=bks, BV=pow2_tile(V, tiles.bwd_block_v), num_warps=tiles.bwd_values_warps, num_stages=1,
    )
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dg = torch.empty_like(g)
    dbeta = torch.empty_like(beta)
    _bwd_pairs_kernel[(NT, B * H)](
        q, k, Gs, beta, dAs, dQG, dKG, dXH, dGAM, DB, dq, dk, dg, dbeta, scale, T,
        H=H, K=K, BKS=bks, SHIFT=DIAG_SHIFT, CLAMP=EXP2_CLAMP, num_warps=tiles.bwd_pairs_warps, num_stages=1,
    )
    return dq, dk, dv, dg, dbeta
