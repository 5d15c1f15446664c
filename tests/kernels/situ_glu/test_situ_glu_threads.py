"""kernels.situ_glu on several threads: the element ranges split across torch's intra-op threads give
every element the bits of the one-thread call, forward and backward (kernels/cpu_threads.py)."""

import pytest
import torch

from kernels.cpu_threads import row_ranges
from kernels.situ_glu import cpu, situ_glu

needs_kernel = pytest.mark.skipif(cpu.load() is None, reason=f"C kernel not built: {cpu.load_error()}")


def test_row_ranges_cover_the_rows_once_on_aligned_boundaries(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    ranges = row_ranges(1003, align=16, min_rows=100)
    assert ranges[0][0] == 0 and ranges[-1][1] == 1003 and len(ranges) == 3
    assert all(hi == lo2 for (_, hi), (lo2, _) in zip(ranges, ranges[1:]))
    assert all(lo % 16 == 0 for lo, _ in ranges)
    assert row_ranges(150, min_rows=100) == [(0, 150)]  # too few rows to split


@needs_kernel
def test_a_split_call_gives_the_one_thread_bits():
    torch.manual_seed(0)
    n = 3 * 32768 + 7  # three threads' worth and a tail
    g, v, dy = torch.randn(n) * 3, torch.randn(n) * 20, torch.randn(n)
    threads = torch.get_num_threads()
    results = []
    try:
        for t in (1, 3):
            torch.set_num_threads(t)
            gg, vv = g.clone().requires_grad_(), v.clone().requires_grad_()
            y = situ_glu(gg, vv, 4.0, 25.0)
            y.backward(dy)
            results.append((y.detach(), gg.grad, vv.grad))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))
