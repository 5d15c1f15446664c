"""Linear layer followed by exact GELU (KernelBench level 2 style fusion: Gemm + GELU).

y = GELU(x W^T + b),  GELU(z) = z/2 * (1 + erf(z / sqrt(2)))
"""

import math

import torch
import torch.nn as nn

batch_size = 128
in_features = 512
out_features = 512


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.linear(x)
        return 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
