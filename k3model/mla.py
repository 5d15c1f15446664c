"""Gated Multi-head Latent Attention with no positional encoding (DeepSeek-V2 MLA; Kimi Linear NoPE;
gated attention "G1", Qiu et al. 2025; research/recipe.md §2).

    c_q  = RMSNorm(W_dq x)                 (or q straight from x when q_rank is None)
    q    = W_uq c_q                        per head [q_nope; q_rope], no rotation (NoPE)
    [c_kv; k_r] = W_dkv x                  the cache holds [RMSNorm(c_kv); k_r]: kv_rank + rope_dim per token
    [k_nope; v] = W_ukv RMSNorm(c_kv)      per head; k = [k_nope; k_r], k_r shared by all heads
    a    = softmax(q kᵀ / √(nope + rope) + causal mask) v
    y    = W_o( a ⊙ sigmoid(W_g x) )       full-rank sigmoid output gate

Training and prefill up-project keys and values for every token; decode steps over a cache fold
W_uk into the queries instead (`_attend_absorbed`), the same function in another order.

Max-logit monitor and QK-Clip (Kimi K2 §2.1 "MuonClip"): with `track_max_logit` on, a training
forward records each head's S_max,h = max over rows and causal pairs of q_h·k_h / √(nope + rope)
(`max_logit_H`, on the device). `qk_clip_(τ)` then rescales the weights of every head with S_max,h > τ
by γ_h = τ / S_max,h, split as K2 does for MLA: q^C (the head's q_nope rows) and k^C (its k_nope rows
of W_ukv) by √γ_h, q^R (its q_rope rows) by γ_h, and the shared k^R (W_dkv's rope rows) not at all —
so each of the head's logits, q^C·k^C + q^R·k^R, is scaled by exactly γ_h and S_max,h becomes τ.
Legend: B batch, T new tokens, P cached tokens, H heads, L latent width (kv_rank + rope_dim),
X = T·H query rows, F the queries' first projection (H·(nope + rope), or q_rank), G = H·v_head_dim.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3model.common import RMSNorm
from k3model.config import MLAConfig



def causal_attention(q_BHTQ: torch.Tensor, k_BHTQ: torch.Tensor, v_BHTV: torch.Tensor) -> torch.Tensor:
    """Causal SDPA whose values may be narrower than the queries and keys (MLA: nope + rope vs v).
    PyTorch's fused CPU kernel needs one head dim for all three, and without it SDPA takes the math
    path, which materializes every [T, T] score (most of an 8,192-token forward on tiny). On the CPU
    the values are zero-padded to the query width and the padded output columns dropped: the same
    attention (a zero value column gives a zero output column), 6.7× faster at T = 8,192
    (benchmarks/results/train/2026-12-01_mla_flash_forecast_tiny_cpu.json). CUDA's kernels take the narrower values as they are."""
    dv, dq = v_BHTV.shape[-1], q_BHTQ.shape[-1]
    if v_BHTV.device.type != "cpu" or dv >= dq:
        return F.scaled_dot_product_attention(q_BHTQ, k_BHTQ, v_BHTV, is_causal=True)
    padded = F.pad(v_BHTV, (0, dq - dv))
    return F.scaled_dot_product_attention(q_BHTQ, k_BHTQ, padded, is_causal=True)[..., :dv]

@torch.no_grad()
def causal_max_logit(q_BHTQ: torch.Tensor, k_BHTQ: torch.Tensor, scale: float,
                     chunk: int | None = None) -> torch.Tensor:
    """Per head, the largest pre-softmax logit scale·q_t·k_s over the batch and every causal pair
    s ≤ t: [H], fp32. Scores are formed `chunk` query rows at a time (default: ≤ 2²⁴ scores, 64 MB,
    per chunk), as the fused attention never materializes them. Costs about one Q·Kᵀ: 0.75 s per
    MLA layer at tiny's 8,192 tokens on one CPU thread, 512-row chunks (docs/log/pretrain.md)."""
    B, H, T, _ = q_BHTQ.shape
    if chunk is None:
        chunk = max(16, min(T, (1 << 24) // max(B * H * T, 1)))
    best_H = torch.full((H,), float("-inf"), device=q_BHTQ.device)
    q_BHTQ, kt_BHQT = q_BHTQ.float() * scale, k_BHTQ.float().transpose(-1, -2)
    future_CC = torch.ones(chunk, chunk, dtype=torch.bool, device=q_BHTQ.device).triu(1)
    for start in range(0, T, chunk):
        stop = min(start + chunk, T)
        q_BHCQ = q_BHTQ[:, :, start:stop]
        # Keys before the chunk are visible to all its rows: no mask; only the diagonal block has one.
        if start > 0:
            best_H = torch.maximum(best_H, (q_BHCQ @ kt_BHQT[..., :start]).amax(dim=(0, 2, 3)))
        n = stop - start
        diag_BHCC = (q_BHCQ @ kt_BHQT[..., start:stop]).masked_fill(future_CC[:n, :n], float("-inf"))
        best_H = torch.maximum(best_H, diag_BHCC.amax(dim=(0, 2, 3)))
    return best_H


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
        # Off by default: the monitor costs a second Q·Kᵀ (no P·V) per training forward.
        self.track_max_logit = False
        self.max_logit_H: torch.Tensor | None = None

    def qk_clip_(self, tau: float) -> torch.Tensor:
        """Rescale W_q / W_k of each head whose last recorded max logit exceeds `tau` (module
        docstring); returns how many heads were clipped (a 0-d tensor: no host sync). Device-side and
        branch-free, so it can run inside a captured step."""
        if not tau > 0:
            raise ValueError(f"QK-Clip's threshold tau must be > 0, got {tau}")
        if self.max_logit_H is None:
            raise ValueError("qk_clip_ needs a recorded max logit: set track_max_logit = True and run a "
                             "training forward first")
        cfg = self.cfg
        H, nope, rope, dv = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        s_H = self.max_logit_H
        # NaN compares False: a head whose logits are not finite is left alone (the loss will say so).
        over_H = s_H > tau
        gamma_H = torch.where(over_H, tau / s_H.clamp(min=tau), torch.ones_like(s_H))
        q_weight = self.q_proj.weight if cfg.q_rank is None else self.q_up.weight
        with torch.no_grad():
            w_q = q_weight.view(H, nope + rope, -1)
            w_q[:, :nope].mul_(gamma_H.sqrt().view(H, 1, 1).to(w_q.dtype))
            w_q[:, nope:].mul_(gamma_H.view(H, 1, 1).to(w_q.dtype))
            w_kv = self.kv_up.weight.view(H, nope + dv, -1)
            w_kv[:, :nope].mul_(gamma_H.sqrt().view(H, 1, 1).to(w_kv.dtype))
        return over_H.sum()

    def in_projections(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Everything the layer projects x to, in this order: the queries' first projection (W_q x
        [B, T, H·(nope + rope)], or W_dq x [B, T, q_rank] with q_rank), the latent W_dkv x [B, T, L]
        and the output gate's logits W_g x [B, T, H·dv]. Three GEMMs of one input:
        k3model/fused.py serves them as one."""
        first = self.q_proj if self.cfg.q_rank is None else self.q_down
        return first(x_BTD), self.kv_down(x_BTD), self.g_proj(x_BTD)

    def _queries_from(self, q_first_BTF: torch.Tensor) -> torch.Tensor:
        """The queries from their first projection (`in_projections`): as they are, or through
        RMSNorm and W_uq with q_rank."""
        if self.cfg.q_rank is None:
            return q_first_BTF
        return self.q_up(self.q_norm(q_first_BTF))

    def queries(self, x_BTD: torch.Tensor) -> torch.Tensor:
        """q [B, T, H·(nope + rope)] of x alone (the draft's unrolled attention, k3model/draft.py)."""
        return self._queries_from(self.q_proj(x_BTD) if self.cfg.q_rank is None else self.q_down(x_BTD))

    def forward(self, x_BTD: torch.Tensor, cache=None):
        """Returns (y [B, T, D], cache). `cache` is None (training) or the layer's LatentCache
        (k3model/cache.py), into which this call writes its tokens' entries [ĉ; k_r]."""
        cfg = self.cfg
        q_first_BTF, latent_BTL, gate_logits_BTG = self.in_projections(x_BTD)
        c_hat_BTR, k_rope_BTr = self.kv_norm(latent_BTL[..., : cfg.kv_rank]), latent_BTL[..., cfg.kv_rank:]
        if cache is None:
            return self._attend_expanded(q_first_BTF, gate_logits_BTG, c_hat_BTR, k_rope_BTr), None
        fresh = not cache.owner.static and max(cache.owner.lengths) == 0
        cache.write(torch.cat([c_hat_BTR, k_rope_BTr], dim=-1))
        if fresh:
            # A prefill: the same attention as training, so prompt logits match the training path.
            return self._attend_expanded(q_first_BTF, gate_logits_BTG, c_hat_BTR, k_rope_BTr), cache
        return self._attend_absorbed(q_first_BTF, gate_logits_BTG, cache), cache

    def _attend_expanded(self, q_first_BTF, gate_logits_BTG, c_hat_BTR, k_rope_BTr):
        """Keys and values up-projected for every token, causal SDPA (training and prefill)."""
        cfg = self.cfg
        B, T, _ = c_hat_BTR.shape
        H, nope, rope, dv = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        kv_BTHX = self.kv_up(c_hat_BTR).view(B, T, H, nope + dv)
        k_BTHQ = torch.cat([kv_BTHX[..., :nope], k_rope_BTr.unsqueeze(2).expand(B, T, H, rope)], dim=-1)
        v_BTHV = kv_BTHX[..., nope:]
        q_BTHQ = self._queries_from(q_first_BTF).view(B, T, H, nope + rope)
        q, k, v = (t.transpose(1, 2) for t in (q_BTHQ, k_BTHQ, v_BTHV))  # [B, H, T, ·]
        if self.track_max_logit and self.training:
            self.max_logit_H = causal_max_logit(q, k, (nope + rope) ** -0.5)
        a_BTHV = causal_attention(q, k, v).transpose(1, 2)
        gate_BTHV = torch.sigmoid(gate_logits_BTG).view(B, T, H, dv)
        return self.o_proj((a_BTHV * gate_BTHV).reshape(B, T, H * dv))

    def _attend_absorbed(self, q_first_BTF, gate_logits_BTG, cache):
        """Attention over the cached latents with W_uk folded into the queries and W_uv applied after
        (DeepSeek-V2 §2.1.2 "absorb"): q̃_h = W_uk,hᵀ q_nope,h, score = q̃_h·ĉ_s + q_rope,h·k_r,s,
        a_h = W_uv,h Σ_s p_s ĉ_s. A step then costs O(cached tokens · latent width), with no
        up-projection of the past. Dynamic caches attend per group of rows of equal length to
        exactly their own keys, so a row's numbers do not depend on the other rows (engine.py);
        static caches attend to the whole buffer under a length mask (fixed shapes for CUDA graphs).
        Legend: R kv_rank, E = R + rope latent entry, S keys."""
        cfg = self.cfg
        B, T, _ = q_first_BTF.shape
        device = q_first_BTF.device
        H, nope, rope, dv, R = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim, cfg.kv_rank
        w_HXR = self.kv_up.weight.view(H, nope + dv, R)
        q_BTHQ = self._queries_from(q_first_BTF).view(B, T, H, nope + rope)
        q_lat_BTHR = torch.einsum("bthn,hnr->bthr", q_BTHQ[..., :nope], w_HXR[:, :nope].to(q_BTHQ.dtype))
        q_BXE = torch.cat([q_lat_BTHR, q_BTHQ[..., nope:]], dim=-1).reshape(B, T * H, R + rope)
        scale = (nope + rope) ** -0.5
        buffer_BSE = cache.buffer_BSL
        owner = cache.owner
        if owner.static:
            S = buffer_BSE.shape[1]
            # Key s is visible to new token i of row b when s ≤ length_b + i (the write came first).
            pos_S = torch.arange(S, device=device)
            limit_BT = owner.lengths_B.view(B, 1) + torch.arange(T, device=device)
            allowed_BTS = pos_S.view(1, 1, S) <= limit_BT.unsqueeze(-1)
            allowed_BXS = allowed_BTS.unsqueeze(2).expand(B, T, H, S).reshape(B, T * H, S)
            a_BXR = self._latent_softmax(q_BXE, buffer_BSE, scale, allowed_BXS, R)
        else:
            groups: dict[int, list[int]] = {}
            for row, length in enumerate(owner.lengths):
                groups.setdefault(length, []).append(row)
            if len(groups) == 1:
                P = owner.lengths[0]
                a_BXR = self._latent_softmax(q_BXE, buffer_BSE[:, : P + T], scale, self._causal(T, P, H, device), R)
            else:
                a_BXR = q_BXE.new_empty(B, T * H, R)
                for P, rows in groups.items():
                    idx = torch.tensor(rows, device=device)
                    a_BXR[idx] = self._latent_softmax(q_BXE[idx], buffer_BSE[idx, : P + T], scale,
                                                      self._causal(T, P, H, device), R)
        a_BTHV = torch.einsum("bthr,hvr->bthv", a_BXR.view(B, T, H, R), w_HXR[:, nope:].to(a_BXR.dtype))
        gate_BTHV = torch.sigmoid(gate_logits_BTG).view(B, T, H, dv)
        return self.o_proj((a_BTHV * gate_BTHV).reshape(B, T, H * dv))

    @staticmethod
    def _causal(T: int, P: int, H: int, device):
        """[1, T·H, P + T] mask for T new tokens after P cached ones (None when T = 1: all visible)."""
        if T == 1:
            return None
        allowed_TS = torch.ones(T, P + T, dtype=torch.bool, device=device).tril(diagonal=P)
        return allowed_TS.repeat_interleave(H, dim=0).unsqueeze(0)

    @staticmethod
    def _latent_softmax(q_BXE, keys_BSE, scale, allowed_BXS, R):
        scores_BXS = torch.bmm(q_BXE, keys_BSE.transpose(1, 2).to(q_BXE.dtype)).float() * scale
        if allowed_BXS is not None:
            scores_BXS = scores_BXS.masked_fill(~allowed_BXS, float("-inf"))
        p_BXS = scores_BXS.softmax(-1).to(q_BXE.dtype)
        return torch.bmm(p_BXS, keys_BSE[..., :R].to(q_BXE.dtype))
