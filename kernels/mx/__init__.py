"""MX formats (OCP Microscaling v1.0): MXFP4 (E2M1) and MXFP8 (E4M3) with E8M0 block scales.

    quantize_mx(x, fmt, block_size=32, scale_rounding="ceil") -> MXTensor    (.dequantize())
    dequantize(t, dtype=None)                                  -> tensor
    fake_quant_mx(x, fmt, block_size=32, scale_rounding="ceil") -> tensor     (QAT, straight-through)
    mx_linear(x, weight, bias=None, act_fmt=None, path=None)   -> x @ W^T, W an MXFP4 MXTensor [N, K]
    mx_linear_experts(x, weight, ids, path=None)               -> x[j] @ W[ids[j]]^T, W an MXFP4 stack [E, N, K]

fmt is "fp4_e2m1" or "fp8_e4m3"; blocks run along the last dimension. The scale rule, special
values and storage are documented in formats.py and quant.py; naive.py is the float64 reference.
"""

from .formats import FORMATS, SCALE_ROUNDINGS, MXFormat
from .matmul import EXPERTS_PATHS, GEMM_MAX_M, GEMV_MAX_M, PATHS, matmul_path, mx_linear, mx_linear_experts
from .quant import MXTensor, dequantize, fake_quant_mx, fake_quant_path, pack_fp4, quantize_mx, unpack_fp4

__all__ = [
    "FORMATS", "SCALE_ROUNDINGS", "MXFormat", "MXTensor", "quantize_mx", "dequantize", "fake_quant_mx",
    "fake_quant_path", "mx_linear", "mx_linear_experts", "matmul_path", "PATHS", "EXPERTS_PATHS", "GEMV_MAX_M", "GEMM_MAX_M", "pack_fp4", "unpack_fp4",
]
