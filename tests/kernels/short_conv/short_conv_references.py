"""The reference the Triton short conv's tests (interpreter and GPU) compare against: the tap sum of
`kernels/short_conv/naive.py` and the torch L2 formula, with autograd, and the relative RMS error."""

from __future__ import annotations

import torch


def reference(x_BTC, weight_C1W, head_dim, eps=1e-6):
    from kernels.short_conv.naive import short_conv_silu_taps

    y_BTC, _ = short_conv_silu_taps(x_BTC, weight_C1W, None)
    if not head_dim:
        return y_BTC
    y_BTHK = y_BTC.unflatten(-1, (-1, head_dim))
    return (y_BTHK * torch.rsqrt((y_BTHK * y_BTHK).sum(-1, keepdim=True).clamp_min(eps * eps))).flatten(-2)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def outputs_and_grads(fn, x, w, dy):
    """(y, dx, dw) of fn(x, w) with incoming gradient dy, on fresh leaves."""
    x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y = fn(x, w)
    y.backward(dy.to(y.dtype))
    return y.detach(), x.grad, w.grad
