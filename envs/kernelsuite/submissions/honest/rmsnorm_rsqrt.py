"""Honest RMS norm: the mean square through a dot-like reduction, rsqrt, one fused multiply."""

import torch
import torch.nn as nn

eps = 1e-6


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
        return x * inv * self.weight
