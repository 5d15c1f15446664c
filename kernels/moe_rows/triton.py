"""The routed experts' row movement in Triton, without atomics either way (k3model/moe.py, training
on CUDA).

LatentMoE sorts its R = M·K (token, expert) rows by expert: row r is token t_r = order_r // K's slot
order_r % K, and inv = order⁻¹ (viewed [M, K]) names token m's K rows. With z [M, L], the experts'
outputs y [R, L] and the gate weights p [M, K] (fp32):

    dispatch   z_R[r] = z[t_r]                        backward  dz[m] = Σ_k dz_R[inv[m, k]]
    combine    u[m]   = Σ_k p[m, k] · y[inv[m, k]]     backward  dy[inv[m, k]] = p[m, k] · du[m]
                                                                 dp[m, k]     = du[m] · y[inv[m, k]]

Every sum runs in fp32 in slot order k = 0..K−1 and is rounded once to its output's dtype; every
output element is written by exactly one program, so the results are the same bits run to run
(torch's index_select backward and index_add add with atomics: in bf16 for the gather's backward,
rounding after every add, and in no fixed order). The dispatch's forward is torch's index_select.

`dispatch_rows(z, token_R, inv_MK)` and `combine_rows(y, p, inv_MK, dtype)` are the public
functions: `torch.library` custom ops (`k3::moe_dispatch_rows`, `k3::moe_combine_rows` and their
backwards) with autograd, opaque to torch.compile: Inductor keeps each as one call in its graph and
does not fuse it with its neighbours.
Legend: M tokens, K slots a token, R = M·K rows, L width.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# A program's tile is [BLOCK_M, BLOCK_L] with BLOCK_M·BLOCK_L = ROW_TILE (BLOCK_L the width rounded up
# to a power of two, at most MAX_BLOCK_L; wider rows loop over chunks): at L = 512, 4 tokens a program
# and 8 warps, the fastest of six shapes on the H200 (probes-archive:benchmarks/probes/glue_sweep.py, docs/log/gpu.md).
ROW_TILE = 2048
MAX_BLOCK_L = 1024
NUM_WARPS = 8
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _tiles(L: int) -> tuple[int, int]:
    block_l = min(triton.next_power_of_2(L), MAX_BLOCK_L)
    return max(1, ROW_TILE // block_l), block_l


@triton.jit
def _gather_sum_kernel(src_ptr, inv_ptr, w_ptr, out_ptr, M, L, K,
                       WEIGHTED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr):
    """out[m] = Σ_k (w[m, k] ·) src[inv[m, k]] in fp32, slot order: the dispatch's backward (no w) and
    the combine's forward (w = p)."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < M
    for l0 in range(0, L, BLOCK_L):
        cols = l0 + tl.arange(0, BLOCK_L)
        mask = m_ok[:, None] & (cols < L)[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_L], dtype=tl.float32)
        for k in range(K):
            row = tl.load(inv_ptr + m.to(tl.int64) * K + k, mask=m_ok, other=0).to(tl.int64)
            x = tl.load(src_ptr + row[:, None] * L + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if WEIGHTED:
                w = tl.load(w_ptr + m.to(tl.int64) * K + k, mask=m_ok, other=0.0)
                x = w[:, None] * x
            acc += x
        tl.store(out_ptr + m.to(tl.int64)[:, None] * L + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _combine_bwd_kernel(du_ptr, y_ptr, p_ptr, inv_ptr, dy_ptr, dp_ptr, M, L, K,
                        BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr):
    """dy[inv[m, k]] = p[m, k] · du[m] (in y's dtype) and dp[m, k] = du[m] · y[inv[m, k]] (fp32)."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < M
    for k in range(K):
        row = tl.load(inv_ptr + m.to(tl.int64) * K + k, mask=m_ok, other=0).to(tl.int64)
        p = tl.load(p_ptr + m.to(tl.int64) * K + k, mask=m_ok, other=0.0)
        dp = tl.zeros([BLOCK_M], dtype=tl.float32)
        for l0 in range(0, L, BLOCK_L):
            cols = l0 + tl.arange(0, BLOCK_L)
            mask = m_ok[:, None] & (cols < L)[None, :]
            du = tl.load(du_ptr + m.to(tl.int64)[:, None] * L + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            y = tl.load(y_ptr + row[:, None] * L + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dp += tl.sum(du * y, axis=1)
            tl.store(dy_ptr + row[:, None] * L + cols[None, :], (p[:, None] * du).to(dy_ptr.dtype.element_ty), mask=mask)
        tl.store(dp_ptr + m.to(tl.int64) * K + k, dp, mask=m_ok)


# ---- launches ---------------------------------------------------------------------------------------


def _check(rows: torch.Tensor, inv_MK: torch.Tensor, what: str) -> None:
    if rows.dim() != 2 or inv_MK.dim() != 2:
        raise ValueError(f"{what} takes rows [R, L] and inv [M, K], got {tuple(rows.shape)} and {tuple(inv_MK.shape)}")
    if rows.dtype not in DTYPES:
        raise ValueError(f"{what}: rows of {rows.dtype}; the Triton kernels take float32, bfloat16 or float16")
    if inv_MK.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{what}: inv must be an integer permutation (int32 or int64), got {inv_MK.dtype}")
    if not rows.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{what} needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU interpreter), got a "
                         f"tensor on {rows.device}; the CPU takes LatentMoE's index_select / index_add path")


def _gather_sum(src_RL: torch.Tensor, inv_MK: torch.Tensor, w_MK: torch.Tensor | None,
                dtype: torch.dtype) -> torch.Tensor:
    M, K = inv_MK.shape
    L = src_RL.shape[1]
    out = torch.empty(M, L, dtype=dtype, device=src_RL.device)
    if M == 0:
        return out
    block_m, block_l = _tiles(L)
    _gather_sum_kernel[(triton.cdiv(M, block_m),)](
        src_RL.contiguous(), inv_MK.contiguous(), w_MK.contiguous() if w_MK is not None else inv_MK, out, M, L, K,
        WEIGHTED=w_MK is not None, BLOCK_M=block_m, BLOCK_L=block_l, num_warps=NUM_WARPS)
    return out


def combine_backward(du_ML: torch.Tensor, y_RL: torch.Tensor, p_MK: torch.Tensor,
                     inv_MK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dy [R, L] in y's dtype, dp [M, K] fp32) for the incoming gradient du (module docstring)."""
    M, K = inv_MK.shape
    L = y_RL.shape[1]
    dy = torch.empty_like(y_RL)
    dp = torch.empty(M, K, dtype=torch.float32, device=y_RL.device)
    if M == 0:
        return dy, dp
    block_m, block_l = _tiles(L)
    _combine_bwd_kernel[(triton.cdiv(M, block_m),)](
        du_ML.contiguous(), y_RL.contiguous(), p_MK.contiguous(), inv_MK.contiguous(), dy, dp, M, L, K,
        BLOCK_M=block_m, BLOCK_L=block_l, num_warps=NUM_WARPS)
    return dy, dp


# ---- custom ops with autograd -----------------------------------------------------------------------


@torch.library.custom_op("k3::moe_dispatch_rows", mutates_args=())
def _dispatch_op(z_ML: torch.Tensor, token_R: torch.Tensor, inv_MK: torch.Tensor) -> torch.Tensor:
    return z_ML.index_select(0, token_R)


@_dispatch_op.register_fake
def _dispatch_fake(z_ML, token_R, inv_MK):
    return z_ML.new_empty(token_R.shape[0], z_ML.shape[1])


@torch.library.custom_op("k3::moe_dispatch_rows_backward", mutates_args=())
def _dispatch_backward_op(dz_RL: torch.Tensor, inv_MK: torch.Tensor) -> torch.Tensor:
    return _gather_sum(dz_RL, inv_MK, None, dz_RL.dtype)


@_dispatch_backward_op.register_fake
def _dispatch_backward_fake(dz_RL, inv_MK):
    return dz_RL.new_empty(inv_MK.shape[0], dz_RL.shape[1])


def _dispatch_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])


def _dispatch_autograd(ctx, dz_RL):
    (inv_MK,) = ctx.saved_tensors
    return _dispatch_backward_op(dz_RL, inv_MK), None, None


_dispatch_op.register_autograd(_dispatch_autograd, setup_context=_dispatch_setup)


@torch.library.custom_op("k3::moe_combine_rows", mutates_args=())
def _combine_op(y_RL: torch.Tensor, p_MK: torch.Tensor, inv_MK: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _gather_sum(y_RL, inv_MK, p_MK, dtype)


@_combine_op.register_fake
def _combine_fake(y_RL, p_MK, inv_MK, dtype):
    return y_RL.new_empty(inv_MK.shape[0], y_RL.shape[1], dtype=dtype)


@torch.library.custom_op("k3::moe_combine_rows_backward", mutates_args=())
def _combine_backward_op(du_ML: torch.Tensor, y_RL: torch.Tensor, p_MK: torch.Tensor,
                         inv_MK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return combine_backward(du_ML, y_RL, p_MK, inv_MK)


@_combine_backward_op.register_fake
def _combine_backward_fake(du_ML, y_RL, p_MK, inv_MK):
    return y_RL.new_empty(y_RL.shape), p_MK.new_empty(p_MK.shape, dtype=torch.float32)


def _combine_setup(ctx, inputs, output):
    y_RL, p_MK, inv_MK, _ = inputs
    ctx.save_for_backward(y_RL, p_MK, inv_MK)


def _combine_autograd(ctx, du_ML):
    y_RL, p_MK, inv_MK = ctx.saved_tensors
    dy, dp = _combine_backward_op(du_ML, y_RL, p_MK, inv_MK)
    return dy, dp.to(p_MK.dtype), None, None


_combine_op.register_autograd(_combine_autograd, setup_context=_combine_setup)


def dispatch_rows(z_ML: torch.Tensor, token_R: torch.Tensor, inv_MK: torch.Tensor) -> torch.Tensor:
    """z[token_R] ([R, L]); its gradient sums each token's K rows in slot order, without atomics.
    `inv_MK[m, k]` is the row of token m's slot k (token_R[inv_MK[m, k]] = m)."""
    _check(z_ML, inv_MK, "dispatch_rows")
    if token_R.shape[0] != inv_MK.numel() or z_ML.shape[0] != inv_MK.shape[0]:
        raise ValueError(f"dispatch_rows: {z_ML.shape[0]} tokens, {token_R.shape[0]} rows and inv of shape "
                         f"{tuple(inv_MK.shape)}: need R = M·K rows and inv [M, K]")
    return _dispatch_op(z_ML, token_R, inv_MK)


def combine_rows(y_RL: torch.Tensor, p_MK: torch.Tensor, inv_MK: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """u[m] = Σ_k p[m, k] · y[inv[m, k]] ([M, L] in `dtype`), summed in fp32 in slot order; differentiable
    in y and p, without atomics either way."""
    _check(y_RL, inv_MK, "combine_rows")
    if p_MK.shape != inv_MK.shape or y_RL.shape[0] != inv_MK.numel():
        raise ValueError(f"combine_rows: {y_RL.shape[0]} rows, p of shape {tuple(p_MK.shape)} and inv of shape "
                         f"{tuple(inv_MK.shape)}: need R = M·K rows and p, inv both [M, K]")
    return _combine_op(y_RL, p_MK, inv_MK, dtype)
