"""Kimi Delta Attention, token by token: the fp32 reference every fast path is tested against.

Per head, with state S_t ∈ R^{K×V} (Kimi Linear report, Eq. 1; fla `naive_recurrent_kda`):

    S ← S ⊙ exp(g_t)            per-key-channel decay, broadcast over the value axis
    v' = β_t (v_t − Sᵀ k_t)     the delta rule: write only what the state does not already predict
    S ← S + k_t v'ᵀ
    o_t = Sᵀ (scale · q_t)

Layout follows fla: q, k, g `[B, T, H, K]`, v `[B, T, H, V]`, beta `[B, T, H]`, states
`[B, H, K, V]` in fp32; `g` is the per-token log decay (not cumulative); scale defaults to 1/√K.
Legend: B batch, T tokens, H heads, K key width, V value width.
"""

from __future__ import annotations

import torch


def check_kda_inputs(q, k, v, g, beta, initial_state) -> None:
    """Raise ValueError naming the offending tensor when shapes do not follow fla's layout."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if g.shape != q.shape:
        raise ValueError(f"g (per-token log decay) must have q's shape {tuple(q.shape)}, got {tuple(g.shape)}")
    if v.dim() != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] = [{B}, {T}, {H}, V], got {tuple(v.shape)}")
    if beta.shape != (B, T, H):
        raise ValueError(f"beta must be [B, T, H] = [{B}, {T}, {H}], got {tuple(beta.shape)}")
    V = v.shape[-1]
    if initial_state is not None and initial_state.shape != (B, H, K, V):
        raise ValueError(
            f"initial_state must be [B, H, K, V] = [{B}, {H}, {K}, {V}], got {tuple(initial_state.shape)}"
        )


def naive_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference KDA: returns (o [B, T, H, V] in q's dtype, final state [B, H, K, V] fp32 or None)."""
    check_kda_inputs(q, k, v, g, beta, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    q_f, k_f, v_f, g_f, beta_f = (x.float() for x in (q, k, v, g, beta))
    S_BHKV = q.new_zeros(B, H, K, V, dtype=torch.float32)
    if initial_state is not None:
        S_BHKV = S_BHKV + initial_state.float()
    outputs = []
    for t in range(T):
        S_BHKV = S_BHKV * g_f[:, t].exp().unsqueeze(-1)
        k_BHK = k_f[:, t]
        predicted_BHV = torch.einsum("bhk,bhkv->bhv", k_BHK, S_BHKV)
        v_new_BHV = beta_f[:, t].unsqueeze(-1) * (v_f[:, t] - predicted_BHV)
        S_BHKV = S_BHKV + k_BHK.unsqueeze(-1) * v_new_BHV.unsqueeze(-2)
        outputs.append(torch.einsum("bhk,bhkv->bhv", q_f[:, t] * scale, S_BHKV))
    o_BTHV = torch.stack(outputs, dim=1) if outputs else v_f.new_zeros(B, 0, H, V)
    return o_BTHV.to(q.dtype), (S_BHKV if output_final_state else None)


def kda_decode_step(
    q_BHK: torch.Tensor,
    k_BHK: torch.Tensor,
    v_BHV: torch.Tensor,
    g_BHK: torch.Tensor,
    beta_BH: torch.Tensor,
    state_BHKV: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of KDA for generation: returns (o [B, H, V], new state [B, H, K, V] fp32)."""
    o, state = naive_recurrent_kda(
        q_BHK.unsqueeze(1), k_BHK.unsqueeze(1), v_BHV.unsqueeze(1), g_BHK.unsqueeze(1),
        beta_BH.unsqueeze(1), scale=scale, initial_state=state_BHKV, output_final_state=True,
    )
    return o.squeeze(1), state
