"""LatentMoE's row movement between tokens and the expert-sorted rows, atomic-free both ways, in
Triton for CUDA training (`triton.py`: `dispatch_rows`, `combine_rows`); None without triton. The
CPU and inference keep LatentMoE's own index_select / index_add (k3model/moe.py)."""

try:
    from kernels.moe_rows.triton import combine_rows, dispatch_rows
except ImportError:  # an install without triton
    combine_rows = dispatch_rows = None

__all__ = ["combine_rows", "dispatch_rows"]
