"""SwiGLU gate on a packed input (the MLP activation of most current LLMs).

x = [a | b] along the last dimension;  y = a * sigmoid(a) * b
"""

import torch
import torch.nn as nn

batch_size = 128
dim = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return a * torch.sigmoid(a) * b


def get_inputs():
    return [torch.randn(batch_size, 2 * dim)]


def get_init_inputs():
    return []
