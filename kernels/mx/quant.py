"""MX quantize / dequantize / fake-quant on torch tensors (any device), with packed storage.

Same function as kernels/mx/naive.py (see the equations there and in formats.py), computed with
float32 bit arithmetic instead of table searches:

    amax bits -> floor(log2 amax) = exponent field - 127;  "ceil" adds 1 when the mantissa field
    of amax exceeds that of max_normal / 2^emax (0x400000 for fp4, 0x600000 for fp8)
    y = x * 2^-s                                 (exact: a power-of-two scale in float32)
    fp4 codes: a comparison ladder whose thresholds are the midpoints of {0,.5,1,1.5,2,3,4,6}, each
               tie going to the even code ( >0.25, >=0.75, >1.25, >=1.75, >2.5, >=3.5, >5 )
    fp8 codes: clamp to +-448, then torch's float8_e4m3fn cast (round to nearest even); the
               clamp comes first because eager fp8 casts do not saturate (recipe.md §7(d))

Storage (MXTensor): fp4 codes two per byte, element 2i in the low nibble and 2i+1 in the high
nibble (the order of torch.float4_e2m1fn_x2 and Triton's dot_scaled); fp8 codes one per byte;
E8M0 scales one byte per block. A last dimension K that is not a multiple of the block size is
stored zero-padded to Kp and cut back to K on dequantize.

fake_quant_mx is the QAT op: dequantize(quantize(x)) in x's dtype on the forward pass, non-finite
results replaced by x (research/recipe.md §7(b)), and a straight-through gradient (dL/dx = dL/dy).
On a CUDA tensor it runs one fused Triton kernel (kernels/mx/triton/fake_quant.py), elsewhere the
torch ops below; both give identical bits, and the choice is logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .formats import E8M0_BIAS, E8M0_NAN, FP4_E2M1, SCALE_EXP_MAX, SCALE_EXP_MIN, check_scale_rounding, get_format

logger = logging.getLogger("kernels.mx")

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@dataclass(frozen=True)
class MXTensor:
    """A tensor quantized to an MX format in blocks along its last dimension.

    codes:  uint8 [..., Kp // 2] (fp4_e2m1, two codes per byte) or [..., Kp] (fp8_e4m3)
    scales: uint8 [..., Kp // block_size], E8M0 (2^(E - 127), 0xFF = NaN)
    shape:  the original shape [..., K];  dtype: the original dtype (dequantize's default)
    """

    codes: torch.Tensor
    scales: torch.Tensor
    fmt: str
    block_size: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    scale_rounding: str = "ceil"

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scales.numel()

    def element_codes(self) -> torch.Tensor:
        """One code per byte, [..., Kp] (fp4 codes unpacked)."""
        return unpack_fp4(self.codes) if self.fmt == FP4_E2M1.name else self.codes

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize(self, dtype)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., 2n] (values 0..15) -> bytes [..., n]: code 2i low nibble, 2i+1 high nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dimension, got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """bytes [..., n] -> uint8 codes [..., 2n]."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32 for integer e in [-126, 127], built from the exponent bits (exact)."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def _check_input(x: torch.Tensor, fmt: str, block_size: int, scale_rounding: str) -> None:
    get_format(fmt)
    check_scale_rounding(scale_rounding)
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"MX quantization takes {SUPPORTED_DTYPES}, got {x.dtype}: cast x first")
    if x.dim() == 0:
        raise ValueError("MX quantization needs at least one dimension (blocks run along the last one)")
    if block_size < 2 or block_size % 2:
        raise ValueError(f"block_size must be a positive even number (OCP MX uses 32), got {block_size}")


def _quantize_blocks(x: torch.Tensor, fmt: str, block_size: int, scale_rounding: str):
    """x [..., K] -> (y [..., nb, bs] float32 = x / 2^s, zero in NaN blocks; s [..., nb] int32; nonfinite [..., nb])."""
    f = get_format(fmt)
    k = x.shape[-1]
    kp = -(-k // block_size) * block_size
    v = torch.nn.functional.pad(x.float(), (0, kp - k)).reshape(*x.shape[:-1], kp // block_size, block_size)
    amax = v.abs().amax(dim=-1)
    nonfinite = ~torch.isfinite(amax)
    bits = torch.where(nonfinite, 0.0, amax).view(torch.int32)
    s = ((bits >> 23) & 0xFF) - 127 - f.emax
    if scale_rounding == "ceil":
        s = s + ((bits & 0x7FFFFF) > f.max_mantissa_fp32).to(torch.int32)
    s = s.clamp(SCALE_EXP_MIN, SCALE_EXP_MAX)
    y = v * _pow2(-s).unsqueeze(-1)
    y = torch.where(nonfinite.unsqueeze(-1), 0.0, y)
    return y, s, nonfinite


def _encode_fp4(y: torch.Tensor) -> torch.Tensor:
    a = y.abs()
    code = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75)
            + (a > 2.5) + (a >= 3.5) + (a > 5.0))
    return code | (torch.signbit(y).to(torch.uint8) << 3)


def _encode_fp8(y: torch.Tensor) -> torch.Tensor:
    return y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)


def quantize_mx(x: torch.Tensor, fmt: str, block_size: int = 32, scale_rounding: str = "ceil") -> MXTensor:
    """Quantize x to MX format fmt ("fp4_e2m1" or "fp8_e4m3") in blocks along the last dimension."""
    _check_input(x, fmt, block_size, scale_rounding)
    y, s, nonfinite = _quantize_blocks(x, fmt, block_size, scale_rounding)
    if fmt == FP4_E2M1.name:
        codes = pack_fp4(_encode_fp4(y).flatten(-2))
    else:
        codes = _encode_fp8(y).flatten(-2)
    scales = torch.where(nonfinite, E8M0_NAN, s + E8M0_BIAS).to(torch.uint8)
    return MXTensor(codes.contiguous(), scales.contiguous(), fmt, block_size, tuple(x.shape), x.dtype, scale_rounding)


def decode_scales(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 codes -> float32 2^(E - 127) (2^-127 is a float32 subnormal), 0xFF -> NaN."""
    e = scales.to(torch.int32)
    value = torch.where(e == 0, 2.0**-127, _pow2((e - E8M0_BIAS).clamp(min=-126)))
    return torch.where(e == E8M0_NAN, torch.nan, value)


def dequantize(t: MXTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """MXTensor -> values [..., K] in dtype (default: the dtype it was quantized from)."""
    codes = t.element_codes()
    if t.fmt == FP4_E2M1.name:
        v = torch.tensor(_FP4_VALUES, device=codes.device)[codes.long()]
    else:
        v = codes.view(torch.float8_e4m3fn).float()
    v = v.reshape(*t.scales.shape, t.block_size) * decode_scales(t.scales).unsqueeze(-1)
    return v.flatten(-2)[..., : t.shape[-1]].to(dtype or t.dtype)


def fake_quant_torch(x: torch.Tensor, fmt: str, block_size: int = 32, scale_rounding: str = "ceil") -> torch.Tensor:
    """dequantize(quantize_mx(x)) in x.dtype with non-finite results replaced by x; no autograd."""
    dq = dequantize(quantize_mx(x, fmt, block_size, scale_rounding), x.dtype)
    return torch.where(torch.isfinite(dq), dq, x)


_logged_paths: set[tuple[str, str]] = set()


def log_path_once(op: str, path: str, reason) -> None:
    """Logs the first use of each (op, path); reason is a string or a function giving it (so that a hot
    caller builds no string per call)."""
    key = (op, path)
    if key not in _logged_paths:
        _logged_paths.add(key)
        logger.info("kernels.mx.%s: using the %s path (%s)", op, path, reason() if callable(reason) else reason)


def fake_quant_path(x: torch.Tensor) -> str:
    """Which implementation fake_quant_mx uses for x: "triton" on CUDA tensors, else "torch"."""
    from .triton import triton_available

    return "triton" if x.is_cuda and triton_available() else "torch"


class _FakeQuantSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fmt, block_size, scale_rounding):
        path = fake_quant_path(x)
        if path == "triton":
            from .triton.fake_quant import fake_quant_triton

            log_path_once("fake_quant_mx", path, "CUDA tensor")
            return fake_quant_triton(x, fmt, block_size, scale_rounding)
        reason = "CPU tensor" if not x.is_cuda else "Triton is not installed"
        log_path_once("fake_quant_mx", path, reason)
        return fake_quant_torch(x, fmt, block_size, scale_rounding)

    @staticmethod
    def backward(ctx, grad_out):
        # Straight-through estimator: quantization is treated as the identity for the gradient.
        return grad_out, None, None, None


def fake_quant_mx(x: torch.Tensor, fmt: str, block_size: int = 32, scale_rounding: str = "ceil") -> torch.Tensor:
    """QAT fake quantization: the forward value is x rounded through MX format fmt (blocks along
    the last dimension), the gradient passes straight through. Same shape and dtype as x."""
    _check_input(x, fmt, block_size, scale_rounding)
    return _FakeQuantSTE.apply(x, fmt, block_size, scale_rounding)
