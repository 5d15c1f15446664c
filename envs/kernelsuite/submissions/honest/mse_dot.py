"""Honest MSE: the squared norm of the difference through one dot product."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        d = (predictions - targets).reshape(-1)
        return torch.dot(d, d) / d.numel()
