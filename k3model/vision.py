"""A small MoonViT-style vision encoder, trained from scratch jointly with the language model
(K3 report §2.4 per the torchtitan port; research/recipe.md §8).

    patches  = Linear(flatten(p×p×C patch)) + learned absolute position embedding
    features = ViT blocks (pre-norm, bidirectional attention, GELU MLP)
    merged   = 2×2 space-to-depth merge: 4 neighbouring patches concatenated
    tokens   = RMSNorm(W₂ GELU(W₁ merged))     the projector into the LM width ("patchmergerv2")

The image tokens then replace the <|image|> slot tokens of the text sequence (model.py).
Positions inside an image are the encoder's business; the language model itself has no positional
encoding. Legend: N images, C channels, P patches per image, E encoder width, D LM width.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3model.common import RMSNorm
from k3model.config import VisionConfig


class ViTBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp_hidden), nn.GELU(),
                                 nn.Linear(cfg.mlp_hidden, cfg.d_model))

    def forward(self, x_NPE: torch.Tensor) -> torch.Tensor:
        N, P, E = x_NPE.shape
        qkv = self.qkv(self.norm1(x_NPE)).view(N, P, 3, self.n_heads, E // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(N, P, E)
        x_NPE = x_NPE + self.proj(a)
        return x_NPE + self.mlp(self.norm2(x_NPE))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VisionConfig, lm_width: int):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"vision d_model ({cfg.d_model}) must be divisible by n_heads ({cfg.n_heads})")
        self.cfg = cfg
        side = cfg.image_size // cfg.patch_size
        self.patch_embed = nn.Linear(cfg.channels * cfg.patch_size ** 2, cfg.d_model)
        self.pos_embed = nn.Parameter(torch.randn(side * side, cfg.d_model) * 0.02)
        self.blocks = nn.ModuleList(ViTBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        merged = cfg.d_model * cfg.merge ** 2
        self.proj_in = nn.Linear(merged, lm_width, bias=False)
        self.proj_out = nn.Linear(lm_width, lm_width, bias=False)
        self.proj_norm = RMSNorm(lm_width)

    def forward(self, images_NCHW: torch.Tensor) -> torch.Tensor:
        """Images (float, roughly unit scale) → LM-width tokens [N, tokens_per_image, D]."""
        cfg = self.cfg
        N, C, Hpx, Wpx = images_NCHW.shape
        if (C, Hpx, Wpx) != (cfg.channels, cfg.image_size, cfg.image_size):
            raise ValueError(f"images must be [N, {cfg.channels}, {cfg.image_size}, {cfg.image_size}], "
                             f"got {tuple(images_NCHW.shape)}")
        p, side = cfg.patch_size, cfg.image_size // cfg.patch_size
        patches = images_NCHW.reshape(N, C, side, p, side, p).permute(0, 2, 4, 1, 3, 5)
        x = self.patch_embed(patches.reshape(N, side * side, C * p * p)) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        # 2×2 space-to-depth: each merged token concatenates a square of m×m neighbouring patches.
        m = cfg.merge
        x = x.view(N, side // m, m, side // m, m, cfg.d_model).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(N, (side // m) ** 2, m * m * cfg.d_model)
        return self.proj_norm(self.proj_out(F.gelu(self.proj_in(x))))
