"""Expert layer norm: torch's fused layer_norm kernel with the same parameters."""

import torch
import torch.nn as nn
import torch.nn.functional as F

eps = 1e-5


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.bias = nn.Parameter(0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, eps)
