"""Compute kernels, one folder per op: a pure-torch reference (`naive.py`), a torch path for the CPU,
Triton kernels for the GPU, and one public function that dispatches (DESIGN.md §2)."""
