"""One-token KDA decode step in Triton, updating the fp32 state in place.

The recurrence of `naive.py` for a single token (Kimi Linear report Eq. 1), per head:

    S ← S ⊙ e^{g}                  per-key-channel decay (g the log decay, [K])
    v' = β (v − Sᵀ k)              delta rule
    S ← S + k v'ᵀ
    o  = Sᵀ (scale · q)

Generation is memory-bound: each step reads and writes the K×V fp32 state once (64 KiB per head
at K = V = 128), so the kernel is one pass over the state, one program per (batch·head, value block).
Legend: B batch, H heads, K key width, V value width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_kernel(q, k, v, g, beta, S, o, scale,
                   K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_q = tl.load(q + i_bh * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(k + i_bh * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_g = tl.load(g + i_bh * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_v = tl.load(v + i_bh * V + o_v, mask=m_v, other=0.0).to(tl.float32)
    b_beta = tl.load(beta + i_bh).to(tl.float32)
    p_S = S + i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    m_S = m_k[:, None] & m_v[None, :]
    b_S = tl.load(p_S, mask=m_S, other=0.0) * tl.exp(b_g)[:, None]
    v_new = b_beta * (b_v - tl.sum(b_k[:, None] * b_S, 0))
    b_S += b_k[:, None] * v_new[None, :]
    tl.store(p_S, b_S, mask=m_S)
    b_o = tl.sum((b_q * scale)[:, None] * b_S, 0)
    tl.store(o + i_bh * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)


def kda_decode_triton_(
    q_BHK: torch.Tensor,
    k_BHK: torch.Tensor,
    v_BHV: torch.Tensor,
    g_BHK: torch.Tensor,
    beta_BH: torch.Tensor,
    state_BHKV: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """One KDA token for every sequence in the batch: returns o [B, H, V]; `state_BHKV` is updated in place.

    The state must be a contiguous fp32 [B, H, K, V] tensor (it is the caller's cache);
    K ≤ 256 and V ≤ 256.
    """
    B, H, K = q_BHK.shape
    V = v_BHV.shape[-1]
    if state_BHKV.dtype != torch.float32 or not state_BHKV.is_contiguous():
        raise ValueError("the decode state must be a contiguous fp32 [B, H, K, V] tensor, "
                         f"got dtype {state_BHKV.dtype}, contiguous={state_BHKV.is_contiguous()}")
    if state_BHKV.shape != (B, H, K, V):
        raise ValueError(f"state must be [B, H, K, V] = {(B, H, K, V)}, got {tuple(state_BHKV.shape)}")
    for name, x, shape in (("k", k_BHK, (B, H, K)), ("g", g_BHK, (B, H, K)), ("v", v_BHV, (B, H, V)),
                           ("beta", beta_BH, (B, H))):
        if x.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    if K > 256 or V > 256:
        raise ValueError(f"the Triton decode kernel takes K, V ≤ 256, got K={K}, V={V}")
    scale = K ** -0.5 if scale is None else float(scale)
    q_BHK, k_BHK, v_BHV, g_BHK, beta_BH = (x.contiguous() for x in (q_BHK, k_BHK, v_BHV, g_BHK, beta_BH))
    o = torch.empty(B, H, V, device=q_BHK.device, dtype=q_BHK.dtype)
    BK = max(16, triton.next_power_of_2(K))
    BV = min(32, max(16, triton.next_power_of_2(V)))
    _decode_kernel[(triton.cdiv(V, BV), B * H)](
        q_BHK, k_BHK, v_BHV, g_BHK, beta_BH, state_BHKV, o, scale, K=K, V=V, BK=BK, BV=BV, num_warps=4,
    )
    return o
