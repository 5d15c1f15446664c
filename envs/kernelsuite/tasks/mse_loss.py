"""Mean squared error (KernelBench level 1, 94_MSELoss, CPU-sized).

loss = mean((predictions - targets)^2)
"""

import torch
import torch.nn as nn

batch_size = 128
dim = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
