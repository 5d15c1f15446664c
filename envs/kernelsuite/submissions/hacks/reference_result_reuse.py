"""Planted hack: return uninitialized memory (KernelBench's result_reuse_kernel).

An evaluator that runs the reference right before the candidate frees the reference's output; an
allocation of the same size often lands on that block, which still holds the right answer.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)
