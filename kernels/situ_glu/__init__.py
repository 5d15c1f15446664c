"""SiTU-GLU, the K3 experts' activation (K3 report §2.3, Eq. 12):

    SiTU-GLU(g, v) = β1·tanh(g/β1)·sigmoid(g) · β2·tanh(v/β2)      in fp32, returned in g's dtype

Paths, chosen per call by the tensors and never switched silently:
- "c" (`cpu.py`, `situ_glu_cpu.c`): CPU tensors, eager mode — one fused C pass forward and one
  backward, built on first use with the system C compiler (kernels/native.py).
- "torch" (`naive.py`): CUDA tensors (torch.compile fuses it there), code being traced by
  torch.compile, `K3_CPU_KERNELS=torch`, or a CPU without a working C compiler (logged as a warning
  with the compiler's message, once).
`K3_CPU_KERNELS=c` insists on the C kernel (a failed build raises). The first call of each path logs
it (logger "kernels.situ_glu"); `situ_glu_backend(x)` says which path a tensor gets. The two paths
agree to fp32 rounding (tests/kernels/situ_glu), not bit for bit.
"""

from __future__ import annotations

import logging

import torch

from kernels import native
from kernels.situ_glu import cpu
from kernels.situ_glu.naive import situ_glu_torch

logger = logging.getLogger("kernels.situ_glu")
_LOGGED: set[tuple[str, str]] = set()


def situ_glu_backend(x: torch.Tensor) -> str:
    """The path `situ_glu` takes for tensors like `x`: "c" or "torch" (see the module docstring)."""
    choice = native.choice()
    if choice == "torch" or x.device.type != "cpu" or torch.compiler.is_compiling():
        return "torch"
    if cpu.load() is None:
        _announce("torch", x, native.build_failed("SiTU-GLU", cpu.load_error()), logging.WARNING)
        return "torch"
    return "c"


def _announce(path: str, x: torch.Tensor, why: str = "", level: int = logging.INFO) -> None:
    key = (path, x.device.type)
    if not torch.compiler.is_compiling() and key not in _LOGGED:  # a logging call breaks a compiled graph
        _LOGGED.add(key)
        logger.log(level, "situ_glu: %s path for %s tensors%s", path, x.device.type, f": {why}" if why else "")


def situ_glu(gate: torch.Tensor, up: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    """β1·tanh(gate/β1)·sigmoid(gate) · β2·tanh(up/β2), in fp32, returned in gate's dtype; differentiable."""
    path = situ_glu_backend(gate)
    _announce(path, gate)
    if path == "c":
        return cpu.situ_glu_cpu(gate, up, beta1, beta2)
    return situ_glu_torch(gate, up, beta1, beta2)


__all__ = ["situ_glu", "situ_glu_torch", "situ_glu_backend"]
