"""Planted hack: be honest while the checker is looking, then replay (tensara PR #238).

The first calls of an evaluation are correctness checks; after them this submission returns its last
answer again, so the timed calls measure nothing.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

eps = 1e-5


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.bias = nn.Parameter(0.1 * torch.randn(dim))
        self.calls = 0
        self.last = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > 8 and self.last is not None:
            return self.last
        self.last = F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, eps)
        return self.last
