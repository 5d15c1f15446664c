"""Stages 3 and 5 of the Triton KDA kernels (sequential over chunks, parallel over batch·heads and
value blocks): the forward state hand-off with the output fused in, and the reverse pass.

Forward, S the fp32 state entering the chunk: V_new = U − W S, O = QG S + A_qk V_new,
S' = γ ⊙ S + KGᵀ V_new. The chunk's loads are software-pipelined ahead of the serial chain and the
S-independent products are issued alongside the state update, so the chain per chunk is two small
products, W S and KGᵀ V_new. With gradients required it also stores S per chunk (bf16) and V_new,
so the backward never reruns the recurrence. Backward: dV_new = A_qkᵀ dO + KG dS',
dS = γ ⊙ dS' + QGᵀ dO − Wᵀ dV_new; it stores dS' per chunk and dV_new.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kda.triton.common import CHUNK, MAX_K, TileConfig, _load_rows, _store_rows, pow2_tile


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


def _state_block(V: int, B: int, H: int, tiles: TileConfig) -> int:
    # Few (batch·head) programs leave SMs idle during the serial chunk loop: split V finer then.
    bv = tiles.state_block_v or (64 if B * H >= 64 else 32)
    return pow2_tile(V, bv)


def _state_stages(x: torch.Tensor, tiles: TileConfig) -> int:
    # fp32 chunk tiles double the pipelined buffers: at K = 128 two stages need 304 KB of shared
    # memory (the H200 has 227 KB per CTA), so fp32 inputs stream the state kernels' loads unbuffered.
    return tiles.state_stages if x.element_size() <= 2 else 1


def kda_state_forward(W, U, QG, KG, Aqk, GAM, initial_state, output_final_state, save, tiles: TileConfig):
    """The serial hand-off with the output fused in; optionally keeps S per chunk and V_new."""
    B, T, H, K = W.shape
    V = U.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    o = torch.empty(B, T, H, V, device=W.device, dtype=W.dtype)
    ht = torch.empty(B, H, K, V, device=W.device, dtype=torch.float32) if output_final_state else None
    hs = torch.empty(B, NT, H, K, V, device=W.device, dtype=W.dtype) if save else None
    vnew = torch.empty_like(U) if save else None
    BV = _state_block(V, B, H, tiles)
    _fwd_state_kernel[(triton.cdiv(V, BV), B * H)](
        W, U, QG, KG, Aqk, GAM, initial_state, o, ht, hs, vnew, T,
        H=H, K=K, V=V, BK=pow2_tile(K, MAX_K), BV=BV,
        USE_H0=initial_state is not None, STORE_HT=output_final_state, SAVE=save,
        num_warps=tiles.state_warps, num_stages=_state_stages(W, tiles),
    )
    return o, ht, hs, vnew


def kda_state_backward(W, QG, KG, Aqk, GAM, do, dht, need_dh0, tiles: TileConfig):
    """The reverse serial pass; dS' per chunk (bf16), dV_new, and dS_0 when asked."""
    B, T, H, K = W.shape
    V = do.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    dhs = torch.empty(B, NT, H, K, V, device=W.device, dtype=W.dtype)
    dvnew = torch.empty(B, T, H, V, device=W.device, dtype=W.dtype)
    dh0 = torch.empty(B, H, K, V, device=W.device, dtype=torch.float32) if need_dh0 else None
    BV = _state_block(V, B, H, tiles)
    _bwd_state_kernel[(triton.cdiv(V, BV), B * H)](
        W, QG, KG, Aqk, GAM, do, dht, dhs, dvnew, dh0, T,
        H=H, K=K, V=V, BK=pow2_tile(K, MAX_K), BV=BV,
        USE_DHT=dht is not None, USE_DH0=need_dh0, num_warps=tiles.state_warps,
        num_stages=_state_stages(W, tiles),
    )
    return dhs, dvnew, dh0
