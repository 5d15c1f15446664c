"""Expert hinge loss: one fused multiply-add, an in-place clamp on the temporary, one mean."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        margin = torch.addcmul(torch.ones_like(predictions), predictions, targets, value=-1.0)
        return margin.clamp_min_(0).mean()
