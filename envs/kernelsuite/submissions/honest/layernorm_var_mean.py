"""Honest layer norm: one var_mean pass for the statistics, rsqrt, then the affine."""

import torch
import torch.nn as nn

eps = 1e-5


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.bias = nn.Parameter(0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
        return torch.addcmul(self.bias, (x - mean) * torch.rsqrt(var + eps), self.weight)
