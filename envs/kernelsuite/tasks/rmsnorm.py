"""RMS normalization with a learned scale (KernelBench level 1, 36_RMSNorm, over the last dimension).

y = x / sqrt(mean(x^2) + eps) * weight
"""

import torch
import torch.nn as nn

batch_size = 128
dim = 1024
eps = 1e-6


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + eps)
        return x / rms * self.weight


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
