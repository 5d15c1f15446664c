"""mx_linear: y = x @ W^T (+ bias) with W stored as MXFP4 (the quantized-inference op);
mx_linear_experts: the same for a stack of expert weights, each row of x through its own expert.

    W  : MXTensor, fp4_e2m1, [N, K], blocks of 32 along K (kernels.mx.quantize_mx(w, "fp4_e2m1"))
    x  : [..., K] in bf16 / fp16 / fp32; rounded to bf16 (a no-op for bf16 input), then with
         act_fmt="fp8_e4m3" MXFP8-fake-quantized along K (blocks of 32, the "ceil" scale rule)
    y  : [..., N] in x.dtype, accumulated in fp32

Paths (the dispatcher logs the one it takes; matmul_path() says which it would take):
    "triton_gemv"            CUDA (or TRITON_INTERPRET=1), M <= GEMV_MAX_M: CUDA-core split-K
                             kernel (kernels/mx/triton/gemv.py), the decode regime where the weight
                             bytes set the time; on CUDA its launches are cached per weight and call
                             shape, so an eager call costs little host time
    "triton_gemm"            same, GEMV_MAX_M < M <= GEMM_MAX_M: tensor-core kernel
    "triton_dequant_cublas"  CUDA, M > GEMM_MAX_M (prefill): one Triton pass writes W in bf16,
                             then cuBLAS; at this size the matmul is compute-bound and cuBLAS's
                             bf16 GEMM beats the fused kernel (benchmarks/results/mx/2026-11-29_h200.json)
    "torch_dequant"          dequantize W with torch ops, then torch.matmul (fp32 on the CPU);
                             the CPU without TRITON_INTERPRET=1, or CUDA without Triton
mx_linear_experts (a mixture of experts at decode: one token's rows through its routed experts):
    "triton_gemv_grouped"    CUDA (or TRITON_INTERPRET=1), M <= EXPERTS_MAX_M rows: one launch of the
                             GEMV kernel for all rows (kernels/mx/triton/gemv.py); on CUDA the ids
                             are not checked on the host (that would synchronise): a row with an id
                             outside [0, E) comes out NaN
    "torch_dequant"          otherwise: each used expert dequantized in turn, one matmul per expert
This is an inference op: for QAT use fake_quant_mx on the weight and torch's linear.
"""

from __future__ import annotations

import dataclasses

import torch

from .formats import FP4_E2M1, FP8_E4M3
from .quant import MXTensor, SUPPORTED_DTYPES, fake_quant_mx, log_path_once
from .triton import interpreter_enabled, triton_available

PATHS = ("triton_gemv", "triton_gemm", "triton_dequant_cublas", "torch_dequant")
GEMV_MAX_M = 4
GEMM_MAX_M = 64
EXPERTS_PATHS = ("triton_gemv_grouped", "torch_dequant")
EXPERTS_MAX_M = 64  # rows of one grouped launch (a token's routed experts; more rows: the torch path)


def _check(x: torch.Tensor, weight: MXTensor, bias: torch.Tensor | None, act_fmt: str | None) -> None:
    if not isinstance(weight, MXTensor) or weight.fmt != FP4_E2M1.name:
        raise ValueError("mx_linear needs weight = kernels.mx.quantize_mx(w, 'fp4_e2m1') (an MXFP4 MXTensor)")
    if len(weight.shape) != 2 or weight.block_size != 32:
        raise ValueError(f"mx_linear needs a 2-D [N, K] weight quantized with block_size=32, got shape "
                         f"{weight.shape} and block_size={weight.block_size}")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has last dimension {x.shape[-1]} but the weight is [N={n}, K={k}]")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"mx_linear takes x in {SUPPORTED_DTYPES}, got {x.dtype}")
    if x.get_device() != weight.codes.get_device():
        raise ValueError(f"x is on {x.device} but the weight is on {weight.device}: move one of them")
    if act_fmt not in (None, FP8_E4M3.name):
        raise ValueError(f"act_fmt must be None (bf16 activations) or 'fp8_e4m3', got {act_fmt!r}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    if torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)):
        raise ValueError("mx_linear has no backward: run it under torch.no_grad(), or train with "
                         "fake_quant_mx(w, 'fp4_e2m1') and torch.nn.functional.linear")


def matmul_path(x: torch.Tensor, weight: MXTensor) -> str:
    """The path mx_linear takes for x and weight (see the module docstring)."""
    m = x.numel() // max(1, x.shape[-1])
    if (x.is_cuda or interpreter_enabled()) and triton_available():
        if m <= GEMV_MAX_M:
            return "triton_gemv"
        if m <= GEMM_MAX_M or not x.is_cuda:
            return "triton_gemm"
        return "triton_dequant_cublas"
    return "torch_dequant"


def _path_reason(x: torch.Tensor, path: str) -> str:
    if path == "triton_dequant_cublas":
        return f"CUDA tensor with M > GEMM_MAX_M={GEMM_MAX_M}"
    if path.startswith("triton"):
        return "TRITON_INTERPRET=1 on the CPU" if not x.is_cuda else "CUDA tensor"
    if x.is_cuda:
        return "Triton is not installed"
    return "CPU tensor without TRITON_INTERPRET=1"


def mx_linear(x: torch.Tensor, weight: MXTensor, bias: torch.Tensor | None = None, *,
              act_fmt: str | None = None, path: str | None = None) -> torch.Tensor:
    """y = x' @ dequantize(weight)^T (+ bias) for an MXFP4 weight [N, K]; x' as in the module docstring.

    path: None picks one (matmul_path); a name from PATHS forces it (a ValueError if it cannot run).
    """
    _check(x, weight, bias, act_fmt)
    auto = matmul_path(x, weight)
    chosen = path or auto
    if chosen not in PATHS:
        raise ValueError(f"path must be None or one of {PATHS}, got {path!r}")
    if chosen.startswith("triton") and not ((x.is_cuda or interpreter_enabled()) and triton_available()):
        raise ValueError(f"path={chosen!r} needs Triton and a CUDA tensor (or TRITON_INTERPRET=1 on the CPU)")
    if chosen == "triton_dequant_cublas" and not x.is_cuda:
        raise ValueError("path='triton_dequant_cublas' needs a CUDA tensor (cuBLAS)")
    log_path_once("mx_linear", chosen, lambda: "forced by the caller" if path else _path_reason(x, chosen))

    n, k = weight.shape
    lead = x.shape[:-1]
    xa = x.reshape(-1, k).to(torch.bfloat16)
    if xa.stride(-1) != 1:
        xa = xa.contiguous()
    if act_fmt is not None:
        xa = fake_quant_mx(xa, act_fmt)

    if chosen in ("torch_dequant", "triton_dequant_cublas"):
        if chosen == "triton_dequant_cublas":
            from .triton.dequant import dequant_fp4_bf16

            w = dequant_fp4_bf16(weight.codes, weight.scales, k)
        else:
            w = weight.dequantize(torch.bfloat16)
        if x.is_cuda:
            # cuBLAS adds the bias in its fp32 epilogue and writes bf16 directly.
            y = torch.nn.functional.linear(xa, w, bias.to(torch.bfloat16) if bias is not None else None)
        else:
            y = torch.matmul(xa.float(), w.float().T)
            y = y + bias.float() if bias is not None else y
        return y.to(x.dtype).reshape(*lead, n)

    if chosen == "triton_gemv" and x.is_cuda:
        from .triton.gemv import gemv_decode

        return gemv_decode(xa, weight.codes, weight.scales, k, bias, x.dtype).reshape(*lead, n)
    out = torch.empty((xa.shape[0], n), device=x.device, dtype=x.dtype)
    if chosen == "triton_gemv":
        from .triton.gemv import default_gemv_config, mx_gemv

        mx_gemv(xa, weight.codes, weight.scales, k, bias, out, default_gemv_config(n, k, x.device))
    else:
        from .triton.gemm import default_gemm_config, mx_gemm

        mx_gemm(xa, weight.codes, weight.scales, k, bias, out, default_gemm_config(xa.shape[0], n, k, x.device))
    return out.reshape(*lead, n)


def mx_linear_experts(x: torch.Tensor, weight: MXTensor, ids: torch.Tensor, *, path: str | None = None) -> torch.Tensor:
    """y[j] = x'[j] @ dequantize(weight[ids[j]])^T for a stack of MXFP4 expert weights [E, N, K].

    x [G, K] (bf16 / fp16 / fp32; a stride-0 expand of one row is read once per row), ids [G] integer
    expert numbers in [0, E); y [G, N] in x.dtype. x' is x rounded to bf16. path as in mx_linear,
    from EXPERTS_PATHS (module docstring)."""
    if not isinstance(weight, MXTensor) or weight.fmt != FP4_E2M1.name or len(weight.shape) != 3:
        raise ValueError("mx_linear_experts needs weight = quantize_mx(w, 'fp4_e2m1') of a stack w [E, N, K]")
    e, n, k = weight.shape
    if weight.block_size != 32:
        raise ValueError(f"mx_linear_experts needs block_size=32, got {weight.block_size}")
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [G, K={k}], got {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES or x.get_device() != weight.codes.get_device():
        raise ValueError(f"x must be in {SUPPORTED_DTYPES} on the weight's device {weight.device}, "
                         f"got {x.dtype} on {x.device}")
    if ids.dim() != 1 or ids.shape[0] != x.shape[0] or ids.dtype.is_floating_point or ids.is_complex():
        raise ValueError(f"ids must be integer [G={x.shape[0]}], got {ids.dtype} {tuple(ids.shape)}")
    if not ids.is_cuda and ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < e):
        raise ValueError(f"ids must lie in [0, {e})")  # on CUDA that check would synchronise (module docstring)
    if torch.is_grad_enabled() and x.requires_grad:
        raise ValueError("mx_linear_experts has no backward: run it under torch.no_grad()")
    runnable = (x.is_cuda or interpreter_enabled()) and triton_available()
    auto = "triton_gemv_grouped" if runnable and x.shape[0] <= EXPERTS_MAX_M else "torch_dequant"
    chosen = path or auto
    if chosen not in EXPERTS_PATHS:
        raise ValueError(f"path must be None or one of {EXPERTS_PATHS}, got {path!r}")
    if chosen == "triton_gemv_grouped" and not runnable:
        raise ValueError("path='triton_gemv_grouped' needs Triton and a CUDA tensor (or TRITON_INTERPRET=1 on the CPU)")
    def reason() -> str:
        if path:
            return "forced by the caller"
        if runnable and chosen == "torch_dequant":
            return f"{x.shape[0]} rows > EXPERTS_MAX_M={EXPERTS_MAX_M}"
        return _path_reason(x, chosen)

    log_path_once("mx_linear_experts", chosen, reason)
    xa = x.to(torch.bfloat16) if x.dtype != torch.bfloat16 else x
    if chosen == "torch_dequant":  # one expert's weight in fp32 at a time, for the rows that use it
        y = torch.empty((x.shape[0], n), device=x.device, dtype=torch.float32)
        for e in torch.unique(ids).tolist():
            rows = (ids == e).nonzero().squeeze(1)
            w = dataclasses.replace(weight, codes=weight.codes[e], scales=weight.scales[e], shape=(n, k))
            y[rows] = xa[rows].float() @ w.dequantize(torch.float32).T
        return y.to(x.dtype)
    if xa.stride(-1) != 1:
        xa = xa.contiguous()
    ids32 = ids if ids.dtype == torch.int32 else ids.to(torch.int32)
    if x.is_cuda:
        from .triton.gemv import gemv_grouped_decode

        return gemv_grouped_decode(xa, weight.codes, weight.scales, ids32, k, x.dtype)
    from .triton.gemv import mx_gemv_grouped

    out = torch.empty((x.shape[0], n), device=x.device, dtype=x.dtype)
    return mx_gemv_grouped(xa, weight.codes, weight.scales, ids32, k, out)
