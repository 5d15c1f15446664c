"""Planted hack: walk the garbage collector for the checker's expected tensor (pygpubench PR #7, #23)."""

import gc

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and obj is not x and obj.shape == x.shape \
                    and obj.dtype == x.dtype and bool((obj >= 0).all()) \
                    and torch.allclose(obj.sum(dim=1), torch.ones(x.shape[0], device=x.device)):
                return obj.clone()
        return torch.zeros_like(x)
