"""The short causal convolution + SiLU in torch operations: conv1d on a [B, C, T] transpose (the
reference the C kernel is tested against and the path wherever it does not apply), and the same sum
written as W shifted products (`short_conv_silu_taps`, for torch.compile regions: Inductor fuses it
with the SiLU into one kernel forward and one backward, where conv1d stays a generic depthwise aten
call inside the graph).

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


def short_conv_silu_taps(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, state_BCW: torch.Tensor | None):
    """As `short_conv_silu_torch`, as a sum of W shifted products in the [B, T, C] layout."""
    W, T = weight_C1W.shape[-1], x_BTC.shape[1]
    if state_BCW is None:
        state_BCW = x_BTC.new_zeros(x_BTC.shape[0], x_BTC.shape[2], W - 1)
    padded_BTC = torch.cat([state_BCW.to(x_BTC.dtype).transpose(1, 2), x_BTC], dim=1)
    w_CW = weight_C1W[:, 0].to(x_BTC.dtype)
    y_BTC = padded_BTC[:, 0:T] * w_CW[:, 0]
    for j in range(1, W):
        y_BTC = y_BTC + padded_BTC[:, j:j + T] * w_CW[:, j]
    return F.silu(y_BTC), padded_BTC[:, -(W - 1):].transpose(1, 2)
