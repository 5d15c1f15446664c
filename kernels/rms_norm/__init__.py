"""RMSNorm on the CPU in C (`cpu.py`); the torch path is k3model/common.py's own, which this package,
below k3model, does not import."""

from kernels.rms_norm.cpu import rms_norm_backend, rms_norm_cpu

__all__ = ["rms_norm_backend", "rms_norm_cpu"]
