"""Layer normalization with a learned affine, spelled out (KernelBench level 1, 40_LayerNorm).

y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias, statistics over the last dimension.
"""

import torch
import torch.nn as nn

batch_size = 128
dim = 1024
eps = 1e-5


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.bias = nn.Parameter(0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * self.weight + self.bias


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
