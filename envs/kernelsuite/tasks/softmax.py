"""Row softmax written as three separate passes (KernelBench level 1, 23_Softmax, spelled out).

y_ij = exp(x_ij - max_j x_ij) / sum_j exp(x_ij - max_j x_ij)
"""

import torch
import torch.nn as nn

batch_size = 64
dim = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shifted = x - x.max(dim=1, keepdim=True).values
        e = torch.exp(shifted)
        return e / e.sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
