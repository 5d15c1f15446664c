"""Small building blocks shared by several modules: RMSNorm, the short causal convolution, and a
sigmoid whose bits do not depend on where its tensor ends.

Legend: B batch, T tokens, D width, C channels, W conv window (kernel size).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.rms_norm import rms_norm_backend, rms_norm_cpu
from kernels.short_conv import short_conv_silu


# torch's CPU elementwise kernels run whole vectors, two at a time (32 floats with AVX-512), and the
# remainder through the scalar implementation, whose last bits differ (sigmoid: a quarter of the
# values): an element's bits then depend on how long its tensor is. Small per-row tensors (the
# router's [M, E] scores, KDA's per-head β, AttnRes's depth softmax over [N, B·T]) put a row in the
# remainder in one batch and in the vector body in another, which broke the engine's batch
# invariance whenever those bits mattered (tests/k3model/test_engine.py).
WHOLE_VECTORS = 32


def _padding(n: int) -> int:
    return max(WHOLE_VECTORS - n, (-n) % WHOLE_VECTORS)


def sigmoid_vectorized(x: torch.Tensor) -> torch.Tensor:
    """torch.sigmoid with every element through the vectorized CPU kernel: the flattened input is
    zero-padded to a multiple of WHOLE_VECTORS (≥ one) and the padding dropped; the same values as
    torch.sigmoid's vector body, independent of the tensor's size. CUDA tensors go straight through."""
    n = x.numel()
    pad = _padding(n)
    if pad == 0 or x.device.type != "cpu":
        return torch.sigmoid(x)
    flat = torch.cat([x.reshape(-1), x.new_zeros(pad)])
    return torch.sigmoid(flat)[:n].view(x.shape)


def softmax0_vectorized(x_NX: torch.Tensor) -> torch.Tensor:
    """softmax over dim 0, every column through the vectorized CPU kernel (as `sigmoid_vectorized`:
    the columns, flattened, zero-padded to a multiple of WHOLE_VECTORS)."""
    N = x_NX.shape[0]
    flat_NM = x_NX.reshape(N, -1)
    pad = _padding(flat_NM.shape[1])
    if pad == 0 or x_NX.device.type != "cpu":
        return x_NX.softmax(dim=0)
    padded_NM = torch.cat([flat_NM, flat_NM.new_zeros(N, pad)], dim=1)
    return padded_NM.softmax(dim=0)[:, : flat_NM.shape[1]].reshape(x_NX.shape)


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm with its backward written out: with r = rsqrt(mean(x²) + eps), x̂ = r·x and g = γ ⊙ dy,

        dx = r · (g − x̂ · mean(g ⊙ x̂)),    dγ = Σ_tokens dy ⊙ x̂

    Autograd's chain through pow, mean, rsqrt and two products ran about twice the elementwise
    passes (the tiny CPU step has 15 RMSNorms; issue 17). Same numbers up to fp32 rounding."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x_f = x.float()
        r = torch.rsqrt(x_f.pow(2).mean(-1, keepdim=True) + eps)
        x_hat = x_f * r
        ctx.save_for_backward(x_hat, r, weight)
        return (x_hat * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x_hat, r, weight = ctx.saved_tensors
        dy_f = dy.float()
        g = dy_f * weight.float()
        dx = r * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        dweight = (dy_f * x_hat).reshape(-1, x_hat.shape[-1]).sum(0)
        return dx.to(dy.dtype), dweight.to(weight.dtype), None


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · weight, computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The device test first: on CUDA, Dynamo then never reaches the eager-only dispatch (no graph break).
        if x.device.type == "cpu" and rms_norm_backend(x, self.weight) == "c":
            # fp32 CPU tensors: one C pass each way (kernels/rms_norm), eager inside compiled code too.
            return rms_norm_cpu(x, self.weight, self.eps)
        if torch.compiler.is_compiling():
            # Inductor writes its own fused backward for the plain formula; and torch 2.11's Dynamo
            # drops the gradients of the Function below (zero dx and dγ, tests/k3model/test_compiled.py).
            x_f = x.float()
            return (x_f * torch.rsqrt(x_f.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)
        return _RMSNormFunction.apply(x, self.weight, self.eps)


# Up to this many tokens, an inference call with a state runs the conv as tap dots (see ShortConv).
SMALL_CONV_T = 8


class ShortConv(nn.Module):
    """Depthwise causal conv over time (kernel W, 4 in Kimi Linear) followed by SiLU.

    `state_BCW` holds the last W−1 inputs of the previous call, so a prefill followed by one-token
    steps gives the same outputs as one call over the whole sequence.
    """

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    def forward(self, x_BTC: torch.Tensor, state_BCW: torch.Tensor | None = None):
        if state_BCW is not None and x_BTC.shape[1] == 1:
            # A decode step: one output, a W-tap dot per channel (conv1d's oneDNN call costs ~100×
            # more at this size).
            window_BCW = torch.cat([state_BCW.to(x_BTC.dtype), x_BTC.transpose(1, 2)], dim=2)
            y_BC = (window_BCW * self.weight[:, 0].to(x_BTC.dtype)).sum(-1)
            return F.silu(y_BC).unsqueeze(1), window_BCW[:, :, 1:]
        if x_BTC.shape[1] <= SMALL_CONV_T and not torch.is_grad_enabled():
            # A few tokens after a state (a speculative verify): the decode step's tap dot at every
            # position, cheaper than conv1d here and the same sum as the one-token steps it replaces.
            x_BCT = x_BTC.transpose(1, 2)
            if state_BCW is None:
                state_BCW = x_BCT.new_zeros(x_BCT.shape[0], x_BCT.shape[1], self.kernel - 1)
            padded_BCT = torch.cat([state_BCW.to(x_BCT.dtype), x_BCT], dim=2)
            y_BCT = (padded_BCT.unfold(2, self.kernel, 1) * self.weight[:, 0].to(x_BCT.dtype).unsqueeze(1)).sum(-1)
            # Contiguous, as the one-token step's output is: the KDA layer's L2 norm reduces over its
            # last dim, and on CUDA a strided reduction sums in another order (other last bits).
            return F.silu(y_BCT).transpose(1, 2).contiguous(), padded_BCT[:, :, -(self.kernel - 1):]
        # On the CPU a C kernel on the [B, T, C] rows, else conv1d on the transpose (kernels/short_conv).
        return short_conv_silu(x_BTC, self.weight, state_BCW)
