"""Fused MX fake quantization (QAT): y = dequant(quant(x)) per block along the last dimension in one
kernel, bit-identical to kernels.mx.quant.fake_quant_torch (the MXFP8 activations of mx_linear's
act_fmt="fp8_e4m3" go through it too: Hopper has no MX tensor-core instructions)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.mx.formats import SCALE_ROUNDINGS, get_format
from kernels.mx.triton.common import _e8m0_to_f32, _pow2


@triton.jit
def _fake_quant_kernel(
    x_ptr, y_ptr, R, K, stride_xr, stride_yr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr,
    EMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr, MAXV: tl.constexpr,
    MAX_MANT: tl.constexpr, CEIL: tl.constexpr,
):
    """y = dequant(quant(x)) per block of BS along K, non-finite results replaced by x."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (offs_r[:, None] < R) & (offs_k[None, :] < K)
    rows = offs_r.to(tl.int64)[:, None]
    x_in = tl.load(x_ptr + rows * stride_xr + offs_k[None, :], mask=mask, other=0.0)
    x = tl.reshape(x_in.to(tl.float32), [BLOCK_R, BLOCK_K // BS, BS])

    a = tl.abs(x)
    # NaN and Inf are caught explicitly: tl.max need not propagate NaN.
    bad = tl.max(((a != a) | (a > 3.4028234663852886e38)).to(tl.int32), axis=2) > 0
    amax = tl.where(bad, 0.0, tl.max(a, axis=2))
    bits = amax.to(tl.int32, bitcast=True)
    s = ((bits >> 23) & 0xFF) - 127 - EMAX
    if CEIL:
        s += ((bits & 0x7FFFFF) > MAX_MANT).to(tl.int32)
    s = tl.minimum(tl.maximum(s, -127), 127)

    y = x * _pow2(-s)[:, :, None]
    ay = tl.minimum(tl.abs(y), MAXV)
    # Round |y| to the element grid, ties to even: the grid step is 2^(max(e, EMIN) - MBITS),
    # and adding then subtracting 1.5 * 2^(23 + log2 step) rounds to a multiple of it (RNE).
    e = tl.maximum(((ay.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, EMIN)
    magic = (((e - MBITS + 23 + 127) << 23) | 0x400000).to(tl.float32, bitcast=True)
    q = (ay + magic) - magic
    sign = (y.to(tl.int32, bitcast=True) >> 31) << 31
    q = (q.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    dq = q * _e8m0_to_f32(s + 127)[:, :, None]
    # A block holding NaN or Inf dequantizes to NaN (E8M0 0xFF); QAT keeps x there instead.
    dq = tl.reshape(tl.where(bad[:, :, None], x, dq), [BLOCK_R, BLOCK_K])

    out = dq.to(y_ptr.dtype.element_ty)
    # Values that overflow the output dtype (fp16 near its max) also fall back to x.
    finite = tl.abs(out.to(tl.float32)) <= 3.4028234663852886e38
    out = tl.where(finite, out, x_in.to(y_ptr.dtype.element_ty))
    tl.store(y_ptr + rows * stride_yr + offs_k[None, :], out, mask=mask)


def fake_quant_triton(x: torch.Tensor, fmt: str, block_size: int = 32, scale_rounding: str = "ceil") -> torch.Tensor:
    """One-kernel fake quantization, bit-identical to kernels.mx.quant.fake_quant_torch (no autograd)."""
    f = get_format(fmt)
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding={scale_rounding!r}: use one of {SCALE_ROUNDINGS}")
    if block_size & (block_size - 1) or not 2 <= block_size <= 256:
        raise ValueError(f"the Triton fake-quant kernel takes a power-of-two block_size in [2, 256], got {block_size}")
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    block_k = max(block_size, 128)
    block_r = 8
    grid = (triton.cdiv(x2.shape[0], block_r), triton.cdiv(k, block_k))
    _fake_quant_kernel[grid](
        x2, y, x2.shape[0], k, x2.stride(0), y.stride(0),
        BLOCK_R=block_r, BLOCK_K=block_k, BS=block_size,
        EMAX=f.emax, EMIN=f.emin, MBITS=f.mbits, MAXV=f.max_normal, MAX_MANT=f.max_mantissa_fp32,
        CEIL=scale_rounding == "ceil", num_warps=4,
    )
    return y.reshape(x.shape)
