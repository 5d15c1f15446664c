"""KDA's short convolution with its SiLU (Kimi Linear §4: depthwise, causal, 4 taps), over a sequence
or a prefill after a state:

    y[b, t, c] = SiLU(Σ_{j<W} w[c, j] · x̃[b, t + j − (W − 1), c])        x̃ = x after the state's W − 1 inputs

`short_conv_silu(x_BTC, weight_C1W, state_BCW) -> (y_BTC, new_state_BCW)`. Paths, by the tensors,
never switched silently:
- "c" (`cpu.py`, `short_conv_cpu.c`): fp32 CPU tensors with C a multiple of 8, at most `cpu.MAX_TAPS`
  taps and a state without gradient, eager — rows read and written in place, built on first use with
  the system C compiler.
- "taps" (`naive.short_conv_silu_taps`): inside torch.compile regions, where Inductor fuses the
  shifted products and the SiLU into one kernel (conv1d would stay a generic depthwise call).
- "torch" (`naive.py`): everything else eager, `K3_CPU_KERNELS=torch`, or no working C compiler (logged
  as a warning with the reason, once). `K3_CPU_KERNELS=c` makes a failed build raise.
The first call of each path logs it (logger "kernels.short_conv"); `short_conv_backend(x)` says
which path a tensor gets. The three agree to fp32 rounding (tests/kernels/short_conv).
"""

from __future__ import annotations

import logging

import torch

from kernels import native
from kernels.short_conv import cpu
from kernels.short_conv.naive import short_conv_silu_taps, short_conv_silu_torch

logger = logging.getLogger("kernels.short_conv")
_LOGGED: set[str] = set()


def _announce(path: str, why: str = "", level: int = logging.INFO) -> None:
    if path not in _LOGGED:
        _LOGGED.add(path)
        logger.log(level, "short_conv_silu: %s path%s", path, f" ({why})" if why else "")


def short_conv_backend(x_BTC: torch.Tensor, state_BCW: torch.Tensor | None = None, taps: int | None = None) -> str:
    """"c", "taps" or "torch": the path `short_conv_silu` takes for these tensors and a kernel of `taps`
    taps (module docstring)."""
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
    path = short_conv_backend(x_BTC, state_BCW, taps=weight_C1W.shape[-1])
    if path == "taps":
        return short_conv_silu_taps(x_BTC, weight_C1W, state_BCW)
    _announce(path)
    if path == "c":
        return cpu.short_conv_silu_cpu(x_BTC, weight_C1W, state_BCW)
    return short_conv_silu_torch(x_BTC, weight_C1W, state_BCW)


__all__ = ["short_conv_silu", "short_conv_silu_taps", "short_conv_silu_torch", "short_conv_backend"]
