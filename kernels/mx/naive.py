"""Reference MX quantization (OCP Microscaling v1.0) in plain torch and float64, from explicit tables.

This file is the definition the fast paths are tested against; it favours the spec's wording over
speed. For a block of k values v_1..v_k (k = block_size, 32 in the spec) along the last dimension:

    amax = max_i |v_i|
    s    = floor(log2 amax) - emax                      ("floor", OCP §6.3)
         | ceil(log2(amax / max_normal))                ("ceil", never clips; the default)
    s    = clamp(s, -127, 127);  E = s + 127 (E8M0);   E = 0xFF (NaN) if amax is NaN or Inf
    P_i  = the element value nearest to v_i / 2^s, ties to the even code, saturating at max_normal
    v_i' = 2^s * P_i                                     (NaN for the whole block when E = 0xFF)

Elements are found by searching the table of representable values (nearest by distance, among
equals the code whose last bit is 0), scales by float64 log2 (exact for the fp32/bf16/fp16 inputs
used here: amax / max_normal is exact or lies far from an integer power of two). A last dimension
that is not a multiple of k is padded with zeros, which leaves every block maximum unchanged.
Element codes of a NaN-scale block are 0: the scale alone makes the block NaN.
"""

from __future__ import annotations

import math

import torch

from .formats import (
    E8M0_BIAS, E8M0_NAN, FP4_E2M1, FP8_E4M3, SCALE_EXP_MAX, SCALE_EXP_MIN, check_scale_rounding, get_format,
)

# Code = sign (bit 3) | exponent (bits 2-1) | mantissa (bit 0); exponent 0 is the subnormal 0.5.
FP4_E2M1_VALUES = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)


def e4m3_value(code: int) -> float:
    """OCP FP8 E4M3: sign | 4-bit exponent (bias 7) | 3-bit mantissa; S.1111.111 is NaN, no Inf."""
    sign = -1.0 if code & 0x80 else 1.0
    exp = (code >> 3) & 0xF
    man = code & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    if exp == 0:
        return sign * (man / 8.0) * 2.0 ** (1 - 7)
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


FP8_E4M3_VALUES = tuple(e4m3_value(c) for c in range(256))


def element_table(fmt: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """All 2^bits decoded element values, indexed by code (float64)."""
    f = get_format(fmt)
    values = FP4_E2M1_VALUES if f is FP4_E2M1 else FP8_E4M3_VALUES
    return torch.tensor(values, dtype=torch.float64, device=device)


def decode_elements(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """Element codes (uint8, one code per byte) -> float64 values."""
    return element_table(fmt, codes.device)[codes.long()]


def pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e in float64 for integer e in [-1022, 1023], exactly (built from the exponent bits)."""
    return ((e.long() + 1023) << 52).view(torch.float64)


def decode_e8m0(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 codes (uint8) -> float64 2^(E - 127); 0xFF -> NaN."""
    e = scales.long()
    value = pow2(e - E8M0_BIAS)
    return torch.where(e == E8M0_NAN, math.nan, value)


def encode_elements(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """Finite float64 values -> nearest element code, ties to even, saturating at max_normal."""
    table = element_table(fmt, y.device)
    n_half = table.numel() // 2
    sign_bit = n_half  # fp4: 0x8, fp8: 0x80
    # The non-negative finite values are codes 0 .. n_half-1, minus the NaN code for E4M3.
    mags = table[:n_half]
    mag_codes = torch.arange(n_half, device=y.device)
    finite = ~torch.isnan(mags)
    mags, mag_codes = mags[finite], mag_codes[finite]

    a = y.abs().unsqueeze(-1)
    dist = (a - mags).abs()
    nearest = dist == dist.min(dim=-1, keepdim=True).values
    # Among equally near values take the even code; beyond max_normal the nearest is max_normal.
    key = torch.where(nearest, mag_codes & 1, torch.full_like(mag_codes, 2))
    code = mag_codes[key.argmin(dim=-1)]
    code = code | torch.where(torch.signbit(y), sign_bit, 0)
    return code.to(torch.uint8)


def block_scale_exponent(amax: torch.Tensor, fmt: str, scale_rounding: str) -> torch.Tensor:
    """Per-block amax (float64, finite) -> the unbiased scale exponent s, clamped to [-127, 127]."""
    f = get_format(fmt)
    check_scale_rounding(scale_rounding)
    safe = amax.clamp(min=2.0**-300)  # log2(0) would be -inf; any huge negative is clamped below
    if scale_rounding == "floor":
        s = torch.floor(torch.log2(safe)) - f.emax
    else:
        s = torch.ceil(torch.log2(safe / f.max_normal))
    return s.clamp(SCALE_EXP_MIN, SCALE_EXP_MAX).long()


def quantize(x: torch.Tensor, fmt: str, block_size: int = 32, scale_rounding: str = "ceil"):
    """x [..., K] -> (codes uint8 [..., Kp], scales uint8 [..., Kp / block_size]), Kp = K rounded up.

    Codes are one per byte here (no packing); see kernels.mx.quant for the packed storage.
    """
    get_format(fmt)
    k = x.shape[-1]
    kp = -(-k // block_size) * block_size
    v = torch.nn.functional.pad(x.double(), (0, kp - k))
    v = v.reshape(*x.shape[:-1], kp // block_size, block_size)

    nonfinite = ~torch.isfinite(v).all(dim=-1)
    amax = torch.where(nonfinite, 0.0, v.abs().amax(dim=-1))
    s = block_scale_exponent(amax, fmt, scale_rounding)
    y = v / pow2(s).unsqueeze(-1)
    y = torch.where(nonfinite.unsqueeze(-1), 0.0, y)
    codes = encode_elements(y, fmt).reshape(*x.shape[:-1], kp)
    scales = torch.where(nonfinite, E8M0_NAN, s + E8M0_BIAS).to(torch.uint8)
    return codes, scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, fmt: str, block_size: int, k: int) -> torch.Tensor:
    """(codes [..., Kp], scales [..., Kp / block_size]) -> float64 values [..., k]."""
    v = decode_elements(codes, fmt).reshape(*scales.shape, block_size)
    v = v * decode_e8m0(scales).unsqueeze(-1)
    return v.reshape(*codes.shape)[..., :k]


def fake_quant(x: torch.Tensor, fmt: str, block_size: int = 32, scale_rounding: str = "ceil") -> torch.Tensor:
    """dequantize(quantize(x)) rounded to x.dtype, where non-finite results are replaced by x (the
    QAT convention; a value can overflow x.dtype, e.g. 2^128 from a block near float32's max)."""
    codes, scales = quantize(x, fmt, block_size, scale_rounding)
    dq = dequantize(codes, scales, fmt, block_size, x.shape[-1]).to(x.dtype)
    return torch.where(torch.isfinite(dq), dq, x)


def mx_linear(x: torch.Tensor, w_codes: torch.Tensor, w_scales: torch.Tensor, k: int, act_fmt: str | None = None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """float64 reference for y = x' @ W^T (+ bias): W from MXFP4 codes [N, Kp] (unpacked) and scales,
    x' = x rounded to bf16, then MXFP8-fake-quantized along K when act_fmt == "fp8_e4m3"."""
    w = dequantize(w_codes, w_scales, "fp4_e2m1", 32, k)
    xa = x.to(torch.bfloat16)
    xa = (fake_quant(xa, act_fmt) if act_fmt is not None else xa).double()
    y = xa @ w.T
    return y + bias.double() if bias is not None else y


__all__ = [
    "FP4_E2M1_VALUES", "FP8_E4M3_VALUES", "FP8_E4M3", "e4m3_value", "element_table", "decode_elements",
    "decode_e8m0", "pow2", "encode_elements", "block_scale_exponent", "quantize", "dequantize", "fake_quant",
    "mx_linear",
]
