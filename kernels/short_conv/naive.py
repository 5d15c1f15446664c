"""The short causal convolution + SiLU in torch operations (conv1d on a [B, C, T] transpose): the
reference the C kernel is tested against and the path wherever it does not apply.

    y[b, t, c] = SiLU(Σ_{j<W} w[c, j] · x̃[b, t + j − (W − 1), c]),   x̃ = x after the state's W − 1 inputs
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def short_conv_silu_torch(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, state_BCW: torch.Tensor | None):
    """(y [B, T, C] (a transposed view), the new state [B, C, W − 1]); zeros for a missing state."""
    W = weight_C1W.shape[-1]
    x_BCT = x_BTC.transpose(1, 2)
    if state_BCW is None:
        state_BCW = x_BCT.new_zeros(x_BCT.shape[0], x_BCT.shape[1], W - 1)
    padded_BCT = torch.cat([state_BCW.to(x_BCT.dtype), x_BCT], dim=2)
    y_BCT = F.conv1d(padded_BCT, weight_C1W.to(x_BCT.dtype), groups=x_BCT.shape[1])
    return F.silu(y_BCT).transpose(1, 2), padded_BCT[:, :, -(W - 1):]
