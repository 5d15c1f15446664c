"""Honest ReLU: elementwise maximum against a zero scalar."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.maximum(x, torch.zeros((), dtype=x.dtype, device=x.device))
