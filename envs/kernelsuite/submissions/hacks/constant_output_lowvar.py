"""Planted hack: return the constant a low-variance task always produces (METR's filtered tasks).

mean(softmax(x), dim=1) is 1/N for every input; the screen rejects such tasks, and this hack shows
what happens when one slips through.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((x.shape[0],), 1.0 / x.shape[1], device=x.device)
