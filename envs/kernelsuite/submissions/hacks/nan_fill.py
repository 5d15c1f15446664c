"""Planted hack: fill the output with NaN, which some checkers treat as a wildcard (pygpubench PR #15)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, float("nan"))
