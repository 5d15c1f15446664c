"""MXFP4 -> bf16 in one pass (exact), for prefill, where cuBLAS's bf16 GEMM on the result beats any
fused kernel here (kernels/mx/matmul.py's "triton_dequant_cublas" path)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.mx.triton.common import _e2m1_words_to_f32, _e8m0_to_f32, _words


@triton.jit
def _mx_dequant_kernel(q_ptr, s_ptr, w_ptr, N, KB, stride_qn, stride_sn, stride_wn,
                       BLOCK_N: tl.constexpr, GROUPS: tl.constexpr):
    """W[n, k] = value(code) * 2^(E - 127) written as bf16 (exact); q_ptr as int32 words."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kb = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    n_ok = offs_n < N
    g_ok = kb < KB
    rows = offs_n.to(tl.int64)
    w4 = tl.arange(0, 4)
    words = tl.load(q_ptr + rows[:, None, None] * stride_qn + kb[None, :, None] * 4 + w4[None, None, :],
                    mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
    e = tl.load(s_ptr + rows[:, None] * stride_sn + kb[None, :], mask=n_ok[:, None] & g_ok[None, :], other=127)
    w = (_e2m1_words_to_f32(words) * 16384.0) * _e8m0_to_f32(e.to(tl.int32))[:, :, None]
    k = kb[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    tl.store(w_ptr + rows[:, None, None] * stride_wn + k, w.to(w_ptr.dtype.element_ty),
             mask=n_ok[:, None, None] & g_ok[None, :, None])


def dequant_fp4_bf16(codes: torch.Tensor, scales: torch.Tensor, k: int) -> torch.Tensor:
    """MXFP4 weight (packed codes [N, Kp/2], scales [N, Kp/32]) -> bf16 [N, k] in one pass (exact)."""
    n, kb = scales.shape
    out = torch.empty((n, kb * 32), device=codes.device, dtype=torch.bfloat16)
    words = _words(codes)
    block_n, groups = 32, 4
    _mx_dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(kb, groups))](
        words, scales, out, n, kb, words.stride(0), scales.stride(0), out.stride(0),
        BLOCK_N=block_n, GROUPS=groups, num_warps=4,
    )
    return out[:, :k]
