"""Hinge loss for binary classification (KernelBench level 1, 100_HingeLoss).

loss = mean(clamp(1 - predictions * targets, min=0)), targets in {-1, +1}. The heavy-tailed trials
rescale only the predictions, so the targets stay labels; with KernelBench's old uniform inputs this
loss was nearly constant and a returned constant passed (the "analytical hack").
"""

import torch
import torch.nn as nn

batch_size = 4096
HEAVY_TAILED_INPUTS = (0,)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


def get_inputs():
    predictions = torch.randn(batch_size, 1)
    targets = torch.randint(0, 2, (batch_size, 1)).float() * 2 - 1
    return [predictions, targets]


def get_init_inputs():
    return []
