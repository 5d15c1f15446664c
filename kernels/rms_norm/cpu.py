"""RMSNorm on the CPU in C (`rms_norm_cpu.c`, built on first use by `kernels.native`), forward and
backward, for k3model/common.py's RMSNorm (see the C file for the equations).

The torch Function (k3model/common.py) runs ~5 elementwise passes forward and ~8 backward over its
input; the tiny CPU step has 13 RMSNorms over [2048, 128] or [2048, 64] (~2 ms each forward +
backward at [32, 64, 128] on one thread; issue 17, docs/log/tiny.md). One pass each way here, the
same mathematics up to fp32 rounding, γ's gradient summed in double.

`rms_norm_backend(x)` says which path a tensor gets: "c" for fp32 CPU tensors with D a multiple of 8
(eager islands inside torch.compile'd code), else "torch" — also with `K3_CPU_KERNELS=torch` or without
a working C compiler (logged as a warning with the reason, once); `K3_CPU_KERNELS=c` makes a failed
build raise.

Legend: M rows (all leading dimensions), D width.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from kernels import native

logger = logging.getLogger("kernels.rms_norm")
_LOGGED: set[str] = set()

SOURCE = Path(__file__).with_name("rms_norm_cpu.c")
LANES = 8  # floats per vector along D (D a multiple)
_P, _I, _F = native.PTR, native.I64, native.F32
_SIGNATURES = {
    "rms_norm_forward": [_P] * 4 + [_I] * 2 + [_F],
    "rms_norm_backward": [_P] * 6 + [_I] * 2,
}


def load():
    """The built library, or None when it cannot be built: `load_error()` says why."""
    return native.load(SOURCE, _SIGNATURES)


def load_error() -> str | None:
    return native.load_error(SOURCE)


def _announce(path: str, why: str = "", level: int = logging.INFO) -> None:
    if path not in _LOGGED:
        _LOGGED.add(path)
        logger.log(level, "rms_norm: %s path%s", path, f" ({why})" if why else "")


def rms_norm_backend(x: torch.Tensor, weight: torch.Tensor) -> str:
    """"c" or "torch": the path for this input and weight (module docstring)."""
    if (native.choice() == "torch" or x.device.type != "cpu" or x.dtype != torch.float32
            or weight.dtype != torch.float32 or x.shape[-1] % LANES or x.numel() == 0):
        return "torch"
    if load() is None:
        _announce("torch", native.build_failed("RMSNorm", load_error()), logging.WARNING)
        return "torch"
    _announce("c")
    return "c"


class _RMSNormCPUFunction(torch.autograd.Function):
    """y = γ ⊙ x · rsqrt(mean(x²) + ε) on a contiguous fp32 CPU tensor [..., D]."""

    @staticmethod
    def forward(ctx, x, weight, eps: float):
        D = x.shape[-1]
        M = x.numel() // D
        w = weight.detach().contiguous()
        y, r_M = torch.empty_like(x), torch.empty(M)
        load().rms_norm_forward(x.data_ptr(), w.data_ptr(), y.data_ptr(), r_M.data_ptr(), M, D, eps)
        ctx.save_for_backward(x, w, r_M)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, w, r_M = ctx.saved_tensors
        D = x.shape[-1]
        M = x.numel() // D
        dy = dy.float().contiguous()
        dx, dgamma = torch.empty_like(x), torch.zeros(D, dtype=torch.float64)
        load().rms_norm_backward(x.data_ptr(), w.data_ptr(), r_M.data_ptr(), dy.data_ptr(), dx.data_ptr(),
                                 dgamma.data_ptr(), M, D)
        return dx, dgamma.float(), None


def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x) · weight over the last dimension by the C kernel (`rms_norm_backend(x) == "c"`),
    differentiable in x and the weight."""
    return _RMSNormCPUFunction.apply(x.contiguous(), weight, float(eps))
