"""The MXFP4 GEMM for GEMV_MAX_M < M <= GEMM_MAX_M: acc[BLOCK_N, BLOCK_M] = W_tile @ x_tile^T on the
tensor cores ("swap AB": the decoded weight is the register operand, the small M is the dot's N),
split-K with the fp32 partials summed by _splitk_reduce_kernel. Beyond GEMM_MAX_M cuBLAS's bf16 GEMM
on the dequantized weight wins (benchmarks/results/mx/). Under TRITON_INTERPRET=1 the dot runs in
fp32 (the interpreter multiplies bf16 operands as raw integers); the decoded weights and the
activations are exact in bf16, so only the accumulation order differs from the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.mx.triton import interpreter_enabled
from kernels.mx.triton.common import (
    _check_operands, _e2m1_words_to_f32, _e8m0_to_f32, _reduce_splits, _sm_count, _split_plan, _splits_for, _words,
)


@triton.jit
def _mx_gemm_kernel(
    x_ptr, q_ptr, s_ptr, bias_ptr, y_ptr,
    M, N, K, KB, KB_PER_SPLIT,
    stride_xm, stride_qn, stride_sn, stride_ym, stride_ys,
    ITERS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """q_ptr: the packed codes as int32 words [N, Kp / 8] (stride_qn in words)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    g = tl.arange(0, GROUPS)
    w4 = tl.arange(0, 4)
    kk = tl.arange(0, GROUPS * 32)
    kb_lo = pid_s * KB_PER_SPLIT

    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None, None] * stride_qn
    s_rows = s_ptr + offs_n.to(tl.int64)[:, None] * stride_sn
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for it in range(0, ITERS):
        kb0 = kb_lo + it * GROUPS
        kb = kb0 + g
        g_ok = kb < KB
        words = tl.load(q_rows + kb[None, :, None] * 4 + w4[None, None, :],
                        mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
        e = tl.load(s_rows + kb[None, :], mask=n_ok[:, None] & g_ok[None, :], other=127).to(tl.int32)
        w = _e2m1_words_to_f32(words) * _e8m0_to_f32(e)[:, :, None]
        w = tl.reshape(w, [BLOCK_N, GROUPS * 32]).to(DOT_DTYPE)
        k = kb0 * 32 + kk
        xv = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        acc = tl.dot(w, tl.trans(xv.to(DOT_DTYPE)), acc)
    acc = acc * 16384.0

    # acc is [N, M]; y is [M, N] row-major.
    y_ptrs = offs_m.to(tl.int64)[None, :] * stride_ym + offs_n[:, None]
    mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT:
        tl.store(y_ptr + pid_s.to(tl.int64) * stride_ys + y_ptrs, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptr + y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 16
    block_n: int = 64
    groups: int = 2       # BLOCK_K = 32 * groups
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


def default_gemm_config(m: int, n: int, k: int, device: torch.device) -> GemmConfig:
    if m <= 16:
        cfg = GemmConfig(block_m=16, block_n=128, groups=2, num_warps=4, num_stages=3)
    else:
        cfg = GemmConfig(block_m=64, block_n=128, groups=2, num_warps=4, num_stages=3)
    tiles = -(-n // cfg.block_n) * -(-m // cfg.block_m)
    split = _splits_for(tiles, k, cfg.groups, 4, _sm_count(device))
    return GemmConfig(cfg.block_m, cfg.block_n, cfg.groups, split, cfg.num_warps, cfg.num_stages)


def _dot_dtype():
    # The interpreter computes bf16 dots on the raw uint16 bits; fp32 operands are exact there.
    return tl.float32 if interpreter_enabled() else tl.bfloat16


def mx_gemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, k: int, bias: torch.Tensor | None,
            out: torch.Tensor, cfg: GemmConfig) -> torch.Tensor:
    """Same contract as mx_gemv, on the tensor cores, for larger M."""
    _check_operands(x, codes, scales, k, out)
    m, n, kb = x.shape[0], codes.shape[0], scales.shape[1]
    per, splits = _split_plan(kb, cfg.groups, cfg.split_k)
    target = torch.empty((splits, m, n), device=x.device, dtype=torch.float32) if splits > 1 else out
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), splits)
    words = _words(codes)
    _mx_gemm_kernel[grid](
        x, words, scales, bias if bias is not None else scales, target,
        m, n, k, kb, per,
        x.stride(0), words.stride(0), scales.stride(0), target.stride(-2), target.stride(0),
        ITERS=per // cfg.groups, HAS_BIAS=bias is not None, SPLIT=splits > 1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        GROUPS=cfg.groups, DOT_DTYPE=_dot_dtype(), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        _reduce_splits(target, bias, out)
    return out
