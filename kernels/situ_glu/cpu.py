"""The fused CPU SiTU-GLU: `situ_glu_cpu.c` built with the system C compiler, called through ctypes.

In eager torch SiTU-GLU is ~10 elementwise passes forward and ~12 backward, two of them tanh at
~2.4 ns an element on this machine's AVX-512 dispatch; the tiny training step runs it over ~3M
elements (issue 17, docs/log/tiny.md). The C kernel reads g and v once and writes y forward, reads
g, v and dy and writes dg and dv backward, with its own tanh and exp (about 1–2 ulp, torch's about 1;
kernels/vecmath.h says why it needs its own).

Built on first use by `kernels.native` (a second: no torch headers); `load()` returns None when it
cannot be built and `kernels.situ_glu` then takes the torch path and logs why.

Legend: N elements (any shape, flattened; contiguous fp32 on the CPU).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernels import native
from kernels.cpu_threads import row_ranges, run_ranges

SOURCE = Path(__file__).with_name("situ_glu_cpu.c")
_SIGNATURES = {
    "situ_glu_forward": [native.PTR, native.PTR, native.PTR, native.I64, native.F32, native.F32],
    "situ_glu_backward": [native.PTR] * 5 + [native.I64, native.F32, native.F32],
}


def load():
    """The built library, or None when it cannot be built: `load_error()` says why."""
    return native.load(SOURCE, _SIGNATURES)


def load_error() -> str | None:
    return native.load_error(SOURCE)


class _SituGLUFunction(torch.autograd.Function):
    """y = SiTU-GLU(g, v) on contiguous fp32 CPU tensors; the backward recomputes from g and v."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, v: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
        y = torch.empty_like(g)
        lib, f = load(), 4  # bytes per float: ranges of elements as pointer offsets
        # Range boundaries on multiples of the kernel's 16-float vectors: every element's bits as unsplit.
        run_ranges(lambda lo, hi: lib.situ_glu_forward(g.data_ptr() + f * lo, v.data_ptr() + f * lo,
                                                       y.data_ptr() + f * lo, hi - lo, beta1, beta2),
                   row_ranges(g.numel(), align=16, min_rows=32768))
        ctx.save_for_backward(g, v)
        ctx.betas = (beta1, beta2)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor):
        g, v = ctx.saved_tensors
        dy = dy.float().contiguous()
        dg, dv = torch.empty_like(g), torch.empty_like(v)
        lib, f = load(), 4
        run_ranges(lambda lo, hi: lib.situ_glu_backward(g.data_ptr() + f * lo, v.data_ptr() + f * lo,
                                                        dy.data_ptr() + f * lo, dg.data_ptr() + f * lo,
                                                        dv.data_ptr() + f * lo, hi - lo, *ctx.betas),
                   row_ranges(g.numel(), align=16, min_rows=32768))
        return dg, dv, None, None


def situ_glu_cpu(gate: torch.Tensor, up: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    """SiTU-GLU by the C kernel (`load()` must have succeeded): in fp32, returned in gate's dtype."""
    if gate.shape != up.shape:
        raise ValueError(f"SiTU-GLU needs gate and up of one shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    g = gate.float().contiguous()
    v = up.float().contiguous()
    return _SituGLUFunction.apply(g, v, float(beta1), float(beta2)).to(gate.dtype)
