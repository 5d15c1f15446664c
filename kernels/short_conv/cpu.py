"""The fused CPU short convolution + SiLU: `short_conv_cpu.c`, built on first use by
`kernels.native` and called through ctypes (see the C file for the equations).

The torch path (`naive.py`) runs conv1d on a [B, C, T] transpose of the projection's output with the
history concatenated in front, SiLU on that, and hands KDA a transposed view, so the SiLU backward
and every later elementwise op of the layer walk strided memory; on the tiny CPU step the three
convolutions of a KDA layer were ~8 ms of its ~25 (issue 17, docs/log/tiny.md). This path reads and
writes [B, T, C] rows as they are. Same numbers up to fp32 rounding (the taps summed in another
order; the weight gradient summed in double).

Legend: B batch, T tokens, C channels (a multiple of 8), W taps.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernels import native

SOURCE = Path(__file__).with_name("short_conv_cpu.c")
LANES = 8  # channels per vector in the C kernel: C must be a multiple
MAX_TAPS = 16  # MAX_TAPS in the C file (the backward keeps a register sum per tap)
_SIGNATURES = {
    "short_conv_silu_forward": [native.PTR] * 4 + [native.I64] * 4,
    "short_conv_silu_backward": [native.PTR] * 7 + [native.I64] * 4,
}


def load():
    """The built library, or None when it cannot be built: `load_error()` says why."""
    return native.load(SOURCE, _SIGNATURES)


def load_error() -> str | None:
    return native.load_error(SOURCE)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class _ShortConvSiLUFunction(torch.autograd.Function):
    """y = SiLU(causal depthwise conv(x)) on contiguous fp32 [B, T, C]; the state gets no gradient."""

    @staticmethod
    def forward(ctx, x_BTC, weight_C1W, state_BCW):
        B, T, C = x_BTC.shape
        W = weight_C1W.shape[-1]
        wt_WC = weight_C1W.detach().reshape(C, W).t().contiguous()
        y_BTC = torch.empty_like(x_BTC)
        load().short_conv_silu_forward(x_BTC.data_ptr(), _ptr(state_BCW), wt_WC.data_ptr(), y_BTC.data_ptr(),
                                       B, T, C, W)
        ctx.save_for_backward(x_BTC, wt_WC, state_BCW)
        return y_BTC

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy_BTC):
        x_BTC, wt_WC, state_BCW = ctx.saved_tensors
        B, T, C = x_BTC.shape
        W = wt_WC.shape[0]
        dy_BTC = dy_BTC.float().contiguous()
        # dp: one row's scratch, reused by every batch row (the C kernel's backward)
        dp_TC, dx_BTC = torch.empty(T, C), torch.empty_like(x_BTC)
        dwt_WC = torch.zeros(W, C, dtype=torch.float64)
        load().short_conv_silu_backward(x_BTC.data_ptr(), _ptr(state_BCW), wt_WC.data_ptr(), dy_BTC.data_ptr(),
                                        dp_TC.data_ptr(), dx_BTC.data_ptr(), dwt_WC.data_ptr(), B, T, C, W)
        return dx_BTC, dwt_WC.t().float().reshape(C, 1, W), None


def short_conv_silu_cpu(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, state_BCW: torch.Tensor | None):
    """(SiLU(conv(x)) [B, T, C], the new state [B, C, W − 1]) by the C kernel; `load()` must have
    succeeded, x fp32 with C a multiple of LANES, the state (if any) without gradient."""
    W = weight_C1W.shape[-1]
    x_BTC = x_BTC.contiguous()
    if state_BCW is not None:
        state_BCW = state_BCW.to(x_BTC.dtype).contiguous()
    y_BTC = _ShortConvSiLUFunction.apply(x_BTC, weight_C1W, state_BCW)
    # The new state: the last W − 1 inputs, reaching into the old history when T < W − 1.
    tail_BCt = x_BTC[:, -(W - 1):].transpose(1, 2)
    if x_BTC.shape[1] < W - 1:
        history_BCW = state_BCW if state_BCW is not None else x_BTC.new_zeros(x_BTC.shape[0], x_BTC.shape[2], W - 1)
        tail_BCt = torch.cat([history_BCW, tail_BCt], dim=2)[:, :, -(W - 1):]
    return y_BTC, tail_BCt
