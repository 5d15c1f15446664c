"""KDA's recurrence over a few tokens in Triton: decode steps and speculative verifies.

The recurrence of `naive.py` token by token (Kimi Linear report Eq. 1), per head:

    S ← S ⊙ e^{g}                  per-key-channel decay (g the log decay, [K])
    v' = β (v − Sᵀ k)              delta rule
    S ← S + k v'ᵀ
    o  = Sᵀ (scale · q)

Generation is memory-bound: each step reads and writes the K×V fp32 state once (64 KiB per head
at K = V = 128), so the kernel is one pass over the state, one program per (batch·head, value block),
with the T tokens in a loop inside it. A token's arithmetic does not depend on T (a runtime
argument), so a T-token call gives each token the bits that T one-token calls give it: a speculative
verify then equals the decode steps it stands for (k3model/speculative.py). `kda_recurrent_triton`
can also keep the state after every token (for rollback).
Legend: B batch, H heads, K key width, V value width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _recurrent_kernel(q, k, v, g, beta, S0, S, states, o, scale, T,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      KEEP: tl.constexpr):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_S = m_k[:, None] & m_v[None, :]
    at_S = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    b_S = tl.load(S0 + at_S, mask=m_S, other=0.0)
    B = tl.num_programs(1) // H
    for t in range(T):
        row = (i_b * T + t) * H + i_h  # [B, T, H, ·] inputs
        b_q = tl.load(q + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_k = tl.load(k + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_g = tl.load(g + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + row * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_beta = tl.load(beta + row).to(tl.float32)
        b_S = b_S * tl.exp(b_g)[:, None]
        v_new = b_beta * (b_v - tl.sum(b_k[:, None] * b_S, 0))
        b_S += b_k[:, None] * v_new[None, :]
        b_o = tl.sum((b_q * scale)[:, None] * b_S, 0)
        tl.store(o + row * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
        if KEEP:
            tl.store(states + t * B * H * K * V + at_S, b_S, mask=m_S)
    tl.store(S + at_S, b_S, mask=m_S)


def _launch(q_BTHK, k_BTHK, v_BTHV, g_BTHK, beta_BTH, state_BHKV, final_BHKV, states, scale) -> torch.Tensor:
    B, T, H, K = q_BTHK.shape
    V = v_BTHV.shape[-1]
    if K > 256 or V > 256:
        raise ValueError(f"the Triton recurrent KDA kernel takes K, V ≤ 256, got K={K}, V={V}")
    scale = K ** -0.5 if scale is None else float(scale)
    q_BTHK, k_BTHK, v_BTHV, g_BTHK, beta_BTH = (x.contiguous() for x in (q_BTHK, k_BTHK, v_BTHV, g_BTHK, beta_BTH))
    o = torch.empty(B, T, H, V, device=q_BTHK.device, dtype=q_BTHK.dtype)
    BK = max(16, triton.next_power_of_2(K))
    BV = min(32, max(16, triton.next_power_of_2(V)))
    _recurrent_kernel[(triton.cdiv(V, BV), B * H)](
        q_BTHK, k_BTHK, v_BTHV, g_BTHK, beta_BTH, state_BHKV, final_BHKV, final_BHKV if states is None else states,
        o, scale, T, H=H, K=K, V=V, BK=BK, BV=BV, KEEP=states is not None, num_warps=4,
    )
    return o


def kda_recurrent_triton(q_BTHK: torch.Tensor, k_BTHK: torch.Tensor, v_BTHV: torch.Tensor, g_BTHK: torch.Tensor,
                         beta_BTH: torch.Tensor, initial_state: torch.Tensor, scale: float | None = None,
                         keep_states: bool = False):
    """T tokens of KDA after `initial_state` (contiguous fp32 [B, H, K, V], left as it is). Returns
    (o [B, T, H, V] in q's dtype, the final state, and with keep_states the state after each token
    [T, B, H, K, V], else None). K, V ≤ 256."""
    B, T, H, K = q_BTHK.shape
    V = v_BTHV.shape[-1]
    if initial_state.dtype != torch.float32 or not initial_state.is_contiguous() or initial_state.shape != (B, H, K, V):
        raise ValueError(f"initial_state must be a contiguous fp32 [B, H, K, V] = {(B, H, K, V)} tensor, got "
                         f"{initial_state.dtype} {tuple(initial_state.shape)}, contiguous={initial_state.is_contiguous()}")
    final = torch.empty_like(initial_state)
    states = initial_state.new_empty(T, B, H, K, V) if keep_states else None
    o = _launch(q_BTHK, k_BTHK, v_BTHV, g_BTHK, beta_BTH, initial_state, final, states, scale)
    return o, final, states


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
    # One token, the state read and written in place (each program reads its block before writing it).
    o = _launch(*(x.unsqueeze(1) for x in (q_BHK, k_BHK, v_BHV, g_BHK, beta_BH)), state_BHKV, state_BHKV, None, scale)
    return o[:, 0]
