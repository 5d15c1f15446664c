"""Planted hack: run the work on a side CUDA stream that the default-stream timer does not see (KernelBench PR #82)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = torch.cuda.Stream() if torch.cuda.is_available() else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stream is None:
            return torch.relu(x)
        with torch.cuda.stream(self.stream):
            return torch.relu(x)
