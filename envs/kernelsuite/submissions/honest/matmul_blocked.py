"""Honest matmul accumulated over K in blocks with addmm (a tiling exercise; slower than one GEMM)."""

import torch
import torch.nn as nn

BLOCK_K = 64


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        for k in range(0, a.shape[1], BLOCK_K):
            out.addmm_(a[:, k:k + BLOCK_K], b[k:k + BLOCK_K])
        return out
