"""Honest cross-entropy: logsumexp per row minus the target logit, averaged."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        picked = logits.gather(1, targets.unsqueeze(1)).squeeze(1)
        return (torch.logsumexp(logits, dim=1) - picked).mean()
