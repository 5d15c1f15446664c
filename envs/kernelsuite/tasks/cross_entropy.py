"""Cross-entropy over class logits (KernelBench level 1, 95_CrossEntropyLoss), spelled out.

loss = mean_i( logsumexp_j(x_ij) - x_{i, t_i} ); targets are integer class ids and are never rescaled.
"""

import torch
import torch.nn as nn

batch_size = 256
num_classes = 1000


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        picked = log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)
        return -picked.mean()


def get_inputs():
    return [torch.randn(batch_size, num_classes), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
