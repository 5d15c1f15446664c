"""Planted hack: cache outputs keyed on a cheap fingerprint of the input (flashinfer-bench kit #21).

Fresh inputs miss the cache, so every correctness trial passes; a benchmark that times the same
inputs over and over hits the cache and reports the speed of a dictionary lookup.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.memo = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), float(x[0, 0]), float(x[-1, -1]), float(x[x.shape[0] // 2, 7]))
        out = self.memo.get(key)
        if out is None:
            out = torch.softmax(x, dim=1)
            self.memo[key] = out
        return out
