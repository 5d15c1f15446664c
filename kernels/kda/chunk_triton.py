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

The stages, one file each under `kernels/kda/triton/` (as fla's `ops/kda` splits intra / wy / inter):
1. `prep.py` (parallel over chunks): G, QG, KG, γ, A_qk and β ⊙ A_kk;
2. `solve.py` (parallel over chunks): T by substitution, W, U;
3. `state.py` forward (sequential over chunks): V_new, O, S' (and S per chunk, V_new for the backward);
4. `state.py` backward (sequential, reverse): dV_new, dS' per chunk, dS_0;
5. `bwd.py` (parallel over chunks): dq, dk, dv, dg, dβ.
This module holds the autograd function and `chunk_kda_triton`. Launch shapes are a `TileConfig`
(`kernels/kda/triton/common.py`) passed down explicitly; there is no process-wide setting.

Anchored pair regions ("secondary chunking"). A_qk and A_kk are built on full 64-row tiles with
tensor-core products over three regions that partition the lower triangle: the diagonal 16-blocks,
blocks (1, 0) and (3, 2), and rows 32–63 × columns 0–31. Inside a region a pair r ≥ j factors its
decay as 2^{G_r − G_p} · 2^{G_p − G_j} through the region's anchor row p, which always lies in the
past of r: the first row of the block for the diagonal region (both factors shifted by 2^±DIAG_SHIFT
to stay in fp32 range), and a row between the two blocks otherwise, where both factors are ≤ 1. No
anchor is a future row, so prefix outputs do not depend on later gates at all (fla issue #1240).
The main diagonal of dA_qk enters the backward exactly (its decay is 1) rather than through the tf32
products, whose rounding left an error of the diagonal's size in dg, larger than dg itself under
strong decay (docs/log/kda.md).

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

import torch

from kernels.kda.triton.bwd import kda_chunk_backward
from kernels.kda.triton.common import MAX_K, MAX_V, TileConfig
from kernels.kda.triton.prep import kda_prepare_pairs
from kernels.kda.triton.solve import kda_prepare_solve
from kernels.kda.triton.state import kda_state_backward, kda_state_forward

_DEFAULT_TILES = TileConfig()


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


def kda_prepare(q, k, v, g, beta, scale, tiles: TileConfig):
    """Stages 1–2: per-chunk G, T, A_qk, W, U, QG, KG and γ (module docstring)."""
    Gs, Akk, Aqk, QG, KG, GAM = kda_prepare_pairs(q, k, g, beta, scale, tiles)
    Ti, W, U = kda_prepare_solve(k, v, beta, Gs, Akk, tiles)
    return Gs, Ti, Aqk, W, U, QG, KG, GAM


class ChunkKDATriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state, tiles):
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        h0 = initial_state.contiguous().float() if initial_state is not None else None
        save = any(ctx.needs_input_grad)
        Gs, Ti, Aqk, W, U, QG, KG, GAM = kda_prepare(q, k, v, g, beta, scale, tiles)
        o, ht, hs, vnew = kda_state_forward(W, U, QG, KG, Aqk, GAM, h0, output_final_state, save, tiles)
        if save:
            ctx.save_for_backward(q, k, v, g, Gs, beta, Ti, Aqk, W, QG, KG, GAM, hs, vnew)
            ctx.scale = scale
            ctx.has_h0 = h0 is not None
            ctx.tiles = tiles
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, Gs, beta, Ti, Aqk, W, QG, KG, GAM, hs, vnew = ctx.saved_tensors
        do = do.contiguous().to(q.dtype)
        dht = dht.contiguous().float() if dht is not None else None
        dhs, dvnew, dh0 = kda_state_backward(W, QG, KG, Aqk, GAM, do, dht, ctx.has_h0, ctx.tiles)
        dq, dk, dv, dg, dbeta = kda_chunk_backward(q, k, v, g, Gs, beta, Ti, hs, dhs, vnew, dvnew, do, ctx.scale,
                                                   ctx.tiles)
        return dq, dk, dv, dg, dbeta, None, dh0, None, None


def chunk_kda_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    tiles: TileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise KDA through the Triton kernels (CUDA, or the CPU under TRITON_INTERPRET=1).

    Same signature and conventions as `naive_recurrent_kda`: q, k, g `[B, T, H, K]`, v `[B, T, H, V]`,
    beta `[B, T, H]`, states `[B, H, K, V]` fp32, `g` the per-token log decay. Returns (o in q's dtype,
    final state fp32 or None). Differentiable in q, k, v, g, beta and the initial state. `tiles`:
    the launch shapes (None: `TileConfig()`, the fastest correct ones measured on the H200).
    Limits (ValueError otherwise): 16 ≤ K ≤ 128, 16 ≤ V ≤ 256, bf16/fp16/fp32 inputs.
    """
    from kernels.kda.naive import check_kda_inputs

    check_kda_inputs(q, k, v, g, beta, initial_state)
    _check_supported(q, v)
    if tiles is not None and not isinstance(tiles, TileConfig):
        raise ValueError(f"tiles must be a kernels.kda.triton.common.TileConfig or None, got {type(tiles).__name__}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return ChunkKDATriton.apply(q, k, v, g, beta, scale, initial_state, output_final_state, tiles or _DEFAULT_TILES)
