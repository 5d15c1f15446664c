"""Block attention residuals' depth mix on the CPU in C (`cpu.py`); the torch path is the module's
own code (k3model/attn_res.py), which this package, below k3model, does not import."""

from kernels.attn_res.cpu import attn_res_backend, attn_res_cpu

__all__ = ["attn_res_backend", "attn_res_cpu"]
