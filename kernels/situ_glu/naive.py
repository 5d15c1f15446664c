"""SiTU-GLU in torch operations: the reference the fused CPU kernel is tested against, and the path
on CUDA (where torch.compile fuses it) or wherever the C kernel is not built.

    SiTU-GLU(g, v) = β1·tanh(g/β1)·sigmoid(g) · β2·tanh(v/β2)      (K3 report §2.3, Eq. 12)

computed in fp32 and returned in g's dtype; with β1 = 4, β2 = 25 it is bounded by 100.
"""

from __future__ import annotations

import torch


def situ_glu_torch(gate: torch.Tensor, up: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    """β1·tanh(gate/β1)·sigmoid(gate) · β2·tanh(up/β2), computed in fp32, returned in gate's dtype."""
    g = gate.float()
    v = up.float()
    gate_act = beta1 * torch.tanh(g / beta1) * torch.sigmoid(g)
    up_act = beta2 * torch.tanh(v / beta2)
    return (gate_act * up_act).to(gate.dtype)
