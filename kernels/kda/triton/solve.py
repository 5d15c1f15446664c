"""Stage 2 of the Triton KDA forward (parallel over chunks): T = (I + β ⊙ A_kk)⁻¹, W and U.

T by forward substitution inside the four diagonal 16-blocks (one loop over a [4, 16, 16] tensor)
and block forward substitution for the rest, X_ij = −X_ii Σ_{j≤m<i} A_im X_mj, as fla's `solve_tril`,
in one tf32 pass per product: it forms no power of A, so it stays exact where the doubling product
(I − A)(I + A²)⋯(I + A³²) cancelled (large one-signed A_kk: correlated keys with weak decay, which a
trained layer produced), and its tf32 error stays below the bf16 rounding T is stored with
(tests/kernels/kda/test_inverse_precision.py; the doubling variants are in docs/log/kda.md).
Then W = T (β ⊙ 2^G ⊙ K), U = T (β ⊙ V).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kda.triton.common import CHUNK, TileConfig, _chunk_program, _load_rows, _store_rows, pow2_tile


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
def _inv_unit_lower64(A, Ti, t0, T, sa, PREC: tl.constexpr):
    """(I + A)⁻¹ for the chunk's strictly lower A [64, 64] (rows in memory), stored to Ti: forward
    substitution inside the four diagonal 16-blocks, then block forward substitution,
    X_ij = −X_ii Σ_{j≤m<i} A_im X_mj (fla's `solve_tril`)."""
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
def _prep_solve_kernel(
    k, v, beta, Gs, Akk,
    Ti, W, U,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BKS: tl.constexpr, BV: tl.constexpr,
):
    """T = (I + β ⊙ A_kk)⁻¹ from the prep's scratch `Akk`, then W and U."""
    t0, bt, _ = _chunk_program(T, H)
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
    _inv_unit_lower64(Akk, Ti, t0, T, H * 64, "tf32")
    # T was stored in 16-blocks; W and U read it back whole: make the stores visible.
    tl.debug_barrier()
    Tc = _load_rows(Ti, t0, T, H * 64, c64, c64 < 64, 64)
    _prep_wu(Tc, bF, k, v, Gs, W, U, t0, T, H, K, V, BKS, BV)


def kda_prepare_solve(k, v, beta, Gs, Akk, tiles: TileConfig):
    """T = (I + β ⊙ A_kk)⁻¹, W and U."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    Ti = torch.empty(B, T, H, CHUNK, device=k.device, dtype=k.dtype)
    W = torch.empty_like(k)
    U = torch.empty_like(v)
    _prep_solve_kernel[(NT, B * H)](
        k, v, beta, Gs, Akk, Ti, W, U, T,
        H=H, K=K, V=V, BKS=pow2_tile(K, tiles.prep_key_slice), BV=pow2_tile(V, 128),
        num_warps=tiles.prep_solve_warps, num_stages=1,
    )
    return Ti, W, U
