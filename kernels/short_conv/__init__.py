"""KDA's short convolution with its SiLU (Kimi Linear §4: depthwise, causal, 4 taps), over a sequence
or a prefill after a state:

    y[b, t, c] = SiLU(Σ_{j<W} w[c, j] · x̃[b, t + j − (W − 1), c])        x̃ = x after the state's W − 1 inputs

`short_conv_silu(x_BTC, weight_C1W, state_BCW) -> (y_BTC, new_state_BCW)`. Paths, by the tensors,
never switched silently:
- "triton" (`triton.py`): fp32/bf16/fp16 CUDA tensors without a state (training, prefill from zeros),
  eager or inside torch.compile regions (a custom op), at most `triton.MAX_TAPS` taps, when triton
  imports. The new state (the last W − 1 inputs) is sliced in torch.
- "c" (`cpu.py`, `short_conv_cpu.c`): fp32 CPU tensors with C a multiple of 8, at most `cpu.MAX_TAPS`
  taps and a state without gradient, eager — rows read and written in place, built on first use with
  the system C compiler.
- "taps" (`naive.short_conv_silu_taps`): the rest inside torch.compile regions, where Inductor fuses the
  shifted products and the SiLU into one kernel (conv1d would stay a generic depthwise call).
- "torch" (`naive.py`): everything else eager, `K3_CPU_KERNELS=torch`, or no working C compiler (logged
  as a warning with the reason, once). `K3_CPU_KERNELS=c` makes a failed build raise.
The first call of each path logs it (logger "kernels.short_conv"); `short_conv_backend(x)` says
which path a tensor gets. They agree to fp32 rounding (tests/kernels/short_conv).

`short_conv_silu_l2(x_BTC, weight_C1W, head_dim, eps) -> y_BTC`: the same from zeros, followed by KDA's
L2 norm over each group of head_dim channels, y · rsqrt(max(Σ y², eps²)), in x's dtype: fused into
the Triton kernels on the "triton" path, else the path above and the norm in fp32 torch.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from kernels import native
from kernels.short_conv import cpu
from kernels.short_conv.naive import short_conv_silu_taps, short_conv_silu_torch

try:
    from kernels.short_conv import triton as triton_conv

    _TRITON_ERROR: ImportError | None = None
except ImportError as err:  # a CPU-only install without triton keeps the other paths
    triton_conv, _TRITON_ERROR = None, err

logger = logging.getLogger("kernels.short_conv")
_LOGGED: set[str] = set()


def _announce(path: str, why: str = "", level: int = logging.INFO) -> None:
    if path not in _LOGGED:
        _LOGGED.add(path)
        logger.log(level, "short_conv_silu: %s path%s", path, f" ({why})" if why else "")


def short_conv_backend(x_BTC: torch.Tensor, state_BCW: torch.Tensor | None = None, taps: int | None = None) -> str:
    """"triton", "c", "taps" or "torch": the path `short_conv_silu` takes for these tensors and a kernel
    of `taps` taps (module docstring)."""
    if x_BTC.is_cuda and state_BCW is None and x_BTC.dtype in (torch.float32, torch.bfloat16, torch.float16):
        if _TRITON_ERROR is None and (taps is None or taps <= triton_conv.MAX_TAPS):
            return "triton"
        if not torch.compiler.is_compiling():
            _announce("torch", f"triton failed to import: {_TRITON_ERROR}" if _TRITON_ERROR is not None
                      else f"{taps} taps: the Triton kernel takes at most {triton_conv.MAX_TAPS}")
    if torch.compiler.is_compiling():
        return "taps"
    choice = native.choice()
    if (choice == "torch" or x_BTC.device.type != "cpu" or x_BTC.dtype != torch.float32
            or x_BTC.shape[-1] % cpu.LANES
            or (state_BCW is not None and state_BCW.requires_grad)):
        return "torch"
    if taps is not None and taps > cpu.MAX_TAPS:
        _announce("torch", f"{taps} taps: the C kernel takes at most {cpu.MAX_TAPS}")
        return "torch"
    if cpu.load() is None:
        _announce("torch", native.build_failed("short-conv", cpu.load_error()), logging.WARNING)
        return "torch"
    return "c"


def short_conv_silu(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, state_BCW: torch.Tensor | None = None):
    """(SiLU(causal depthwise conv(x)) [B, T, C], the last W − 1 inputs [B, C, W − 1]); differentiable
    in x and the weight."""
    W = weight_C1W.shape[-1]
    path = short_conv_backend(x_BTC, state_BCW, taps=W)
    if path == "triton":
        if not torch.compiler.is_compiling():
            _announce(path)
        # The last W − 1 inputs, zeros on the left when T < W − 1 (as after a zero state).
        tail_BCT = x_BTC[:, max(x_BTC.shape[1] - (W - 1), 0):].transpose(1, 2)
        return (triton_conv.short_conv_silu_triton(x_BTC, weight_C1W),
                F.pad(tail_BCT, (W - 1 - tail_BCT.shape[2], 0)))
    if path == "taps":
        return short_conv_silu_taps(x_BTC, weight_C1W, state_BCW)
    _announce(path)
    if path == "c":
        return cpu.short_conv_silu_cpu(x_BTC, weight_C1W, state_BCW)
    return short_conv_silu_torch(x_BTC, weight_C1W, state_BCW)


def short_conv_silu_l2(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, head_dim: int, eps: float = 1e-6) -> torch.Tensor:
    """SiLU(causal depthwise conv(x)) from zeros, L2-normalized over each group of `head_dim` channels
    as y · rsqrt(max(Σ y², eps²)), [B, T, C] in x's dtype; differentiable in x and the weight."""
    C = x_BTC.shape[-1]
    if head_dim <= 0 or C % head_dim:
        raise ValueError(f"head_dim must be positive and divide the channels C = {C}, got {head_dim}")
    if short_conv_backend(x_BTC, taps=weight_C1W.shape[-1]) == "triton":
        if not torch.compiler.is_compiling():
            _announce("triton")
        return triton_conv.short_conv_silu_triton(x_BTC, weight_C1W, head_dim, eps)
    y_BTC, _ = short_conv_silu(x_BTC, weight_C1W)
    y_BTHK = y_BTC.float().unflatten(-1, (C // head_dim, head_dim))
    y_BTHK = y_BTHK * torch.rsqrt((y_BTHK * y_BTHK).sum(-1, keepdim=True).clamp_min(eps * eps))
    return y_BTHK.flatten(-2).to(x_BTC.dtype)


__all__ = ["short_conv_silu", "short_conv_silu_l2", "short_conv_silu_taps", "short_conv_silu_torch",
           "short_conv_backend"]
