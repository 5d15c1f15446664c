"""Gated Multi-head Latent Attention with no positional encoding (DeepSeek-V2 MLA; Kimi Linear NoPE;
gated attention "G1", Qiu et al. 2025; research/recipe.md §2).

    c_q  = RMSNorm(W_dq x)                 (or q straight from x when q_rank is None)
    q    = W_uq c_q                        per head [q_nope; q_rope], no rotation (NoPE)
    [c_kv; k_r] = W_dkv x                  the cache holds only this latent: kv_rank + rope_dim per token
    [k_nope; v] = W_ukv RMSNorm(c_kv)      per head; k = [k_nope; k_r], k_r shared by all heads
    a    = softmax(q kᵀ / √(nope + rope) + causal mask) v
    y    = W_o( a ⊙ sigmoid(W_g x) )       full-rank sigmoid output gate

Legend: B batch, T new tokens, P cached tokens, H heads, L latent width (kv_rank + rope_dim).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3model.common import RMSNorm
from k3model.config import MLAConfig


class GatedMLA(nn.Module):
    def __init__(self, cfg: MLAConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.n_heads
        qk_dim = cfg.qk_nope_dim + cfg.qk_rope_dim
        if cfg.q_rank is None:
            self.q_proj = nn.Linear(cfg.d_model, H * qk_dim, bias=False)
        else:
            self.q_down = nn.Linear(cfg.d_model, cfg.q_rank, bias=False)
            self.q_norm = RMSNorm(cfg.q_rank, eps=cfg.norm_eps)
            self.q_up = nn.Linear(cfg.q_rank, H * qk_dim, bias=False)
        self.kv_down = nn.Linear(cfg.d_model, cfg.kv_rank + cfg.qk_rope_dim, bias=False)
        self.kv_norm = RMSNorm(cfg.kv_rank, eps=cfg.norm_eps)
        self.kv_up = nn.Linear(cfg.kv_rank, H * (cfg.qk_nope_dim + cfg.v_head_dim), bias=False)
        self.g_proj = nn.Linear(cfg.d_model, H * cfg.v_head_dim, bias=False)
        self.o_proj = nn.Linear(H * cfg.v_head_dim, cfg.d_model, bias=False)

    def queries(self, x_BTD: torch.Tensor) -> torch.Tensor:
        if self.cfg.q_rank is None:
            return self.q_proj(x_BTD)
        return self.q_up(self.q_norm(self.q_down(x_BTD)))

    def forward(self, x_BTD: torch.Tensor, latent_cache_BPL: torch.Tensor | None = None):
        """Returns (y [B, T, D], the latent of all tokens so far [B, P + T, L] for the cache)."""
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        H, nope, rope, dv = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        latent_BTL = self.kv_down(x_BTD)
        if latent_cache_BPL is not None:
            latent_BTL = torch.cat([latent_cache_BPL.to(latent_BTL.dtype), latent_BTL], dim=1)
        S = latent_BTL.shape[1]  # keys: P cached + T new
        P = S - T
        c_kv, k_rope_BS1R = latent_BTL[..., : cfg.kv_rank], latent_BTL[..., cfg.kv_rank:].unsqueeze(2)
        kv_BSHX = self.kv_up(self.kv_norm(c_kv)).view(B, S, H, nope + dv)
        k_BSHQ = torch.cat([kv_BSHX[..., :nope], k_rope_BS1R.expand(B, S, H, rope)], dim=-1)
        v_BSHV = kv_BSHX[..., nope:]
        q_BTHQ = self.queries(x_BTD).view(B, T, H, nope + rope)

        q, k, v = (t.transpose(1, 2) for t in (q_BTHQ, k_BSHQ, v_BSHV))  # [B, H, ·, ·]
        if P == 0:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # New token i sits at absolute position P + i and sees keys 0 … P + i.
            allowed_TS = torch.ones(T, S, dtype=torch.bool, device=x_BTD.device).tril(diagonal=P)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed_TS)
        a_BTHV = a.transpose(1, 2)
        gate_BTHV = torch.sigmoid(self.g_proj(x_BTD)).view(B, T, H, dv)
        return self.o_proj((a_BTHV * gate_BTHV).reshape(B, T, H * dv)), latent_BTL
