"""Block attention residuals' depth mix: on the CPU in C (`cpu.py`), on CUDA in Triton (`triton.py`,
a torch custom op, absent without triton); the torch path is the module's own code
(k3model/attn_res.py), which this package, below k3model, does not import."""

from kernels.attn_res.cpu import attn_res_backend, attn_res_cpu

try:
    from kernels.attn_res.triton import MAX_SOURCES as TRITON_MAX_SOURCES
    from kernels.attn_res.triton import attn_res_mix_triton
except ImportError:  # an install without triton: CUDA sources take the torch path
    TRITON_MAX_SOURCES = 0
    attn_res_mix_triton = None

__all__ = ["attn_res_backend", "attn_res_cpu", "attn_res_mix_triton", "TRITON_MAX_SOURCES"]
