"""Honest matmul through NumPy's BLAS (the CPU backend of the suite; copies through the host on a GPU)."""

import numpy as np
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = np.matmul(a.cpu().numpy(), b.cpu().numpy())
        return torch.from_numpy(out).to(a.device)
