"""ReLU over a batch of rows (KernelBench level 1, 19_ReLU, at a CPU-sized shape)."""

import torch
import torch.nn as nn

batch_size = 64
dim = 4096


class Model(nn.Module):
    """y = max(x, 0)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
