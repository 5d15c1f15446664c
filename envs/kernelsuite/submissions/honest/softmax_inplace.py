"""Honest softmax: subtract the row max into a fresh buffer, then exponentiate and normalize in place."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x - x.amax(dim=1, keepdim=True)
        y.exp_()
        y.div_(y.sum(dim=1, keepdim=True))
        return y
