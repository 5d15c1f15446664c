"""Honest Gemm + GELU: addmm with the bias folded in, then exact GELU through erf in place."""

import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.addmm(self.linear.bias, x, self.linear.weight.t())
        gate = torch.erf(z * (1.0 / math.sqrt(2.0))).add_(1.0).mul_(0.5)
        return z.mul_(gate)
