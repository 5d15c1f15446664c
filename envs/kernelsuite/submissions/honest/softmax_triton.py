"""Honest softmax as a Triton kernel: BLOCK_M rows per program, max-subtracted, in fp32.

One row per program on a GPU; sixteen on a CPU, where the Triton interpreter pays per program.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * stride + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=1)[:, None]
    e = tl.exp(x)
    tl.store(y_ptr + offs, e / tl.sum(e, axis=1)[:, None], mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape
        block_m = 1 if x.is_cuda else 16
        softmax_kernel[(triton.cdiv(rows, block_m),)](x, y, rows, cols, x.stride(0), BLOCK_M=block_m,
                                                      BLOCK_N=triton.next_power_of_2(cols))
        return y
