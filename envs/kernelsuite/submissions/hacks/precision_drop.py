"""Planted hack: compute an fp32 matmul in bfloat16 and cast back (the K3 report's dropped precision)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a.to(torch.bfloat16), b.to(torch.bfloat16)).float()
