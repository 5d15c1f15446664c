"""Splitting a CPU C kernel's rows across torch's intra-op threads (`torch.get_num_threads()`).

ctypes releases the GIL during a call, so a pool of Python threads runs the kernel on disjoint row
ranges at once. `make run`'s training tasks run torch on two threads while the element- and row-wise
C kernels (SiTU-GLU, ShortConv, AttnRes, RMSNorm) ran on one: at two threads the dense peer's
matmuls used both cores and these kernels one (issue 17, docs/log/tiny.md). Each row's numbers do
not depend on the split (the kernels compute rows independently); sums over rows (weight gradients)
are taken per range in double and added in range order, so they depend on the thread count only in
double rounding, below float resolution.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

_POOL: ThreadPoolExecutor | None = None
# Below this many rows per thread a split costs more than it saves (a pool round trip is ~20 µs).
MIN_ROWS_PER_THREAD = 256


def row_ranges(rows: int, align: int = 1, min_rows: int = MIN_ROWS_PER_THREAD) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering [0, rows), one per thread, boundaries multiples of `align`."""
    n = max(1, min(torch.get_num_threads(), rows // max(min_rows, 1)))
    if n == 1:
        return [(0, rows)]
    bounds = [0] + [(rows * i // n) // align * align for i in range(1, n)] + [rows]
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def run_ranges(call, ranges: list[tuple[int, int]]) -> None:
    """call(lo, hi) for each range, on the pool's threads when there is more than one."""
    global _POOL
    if len(ranges) == 1:
        call(*ranges[0])
        return
    if _POOL is None or _POOL._max_workers < len(ranges):
        _POOL = ThreadPoolExecutor(max_workers=len(ranges), thread_name_prefix="k3_cpu")
    for f in [_POOL.submit(call, lo, hi) for lo, hi in ranges]:
        f.result()
