"""Checks of the Triton kernels under TRITON_INTERPRET=1, run in a subprocess by test_triton_interpret.py.

Triton reads TRITON_INTERPRET when a kernel is decorated, so these cannot share a process with
tests that import the kernels normally. Run one directly with:
    TRITON_INTERPRET=1 python -m tests.kernels.mx.interpret_checks <check-name>
"""

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from kernels.mx import mx_linear, matmul_path, naive, quantize_mx  # noqa: E402
from kernels.mx.quant import fake_quant_torch  # noqa: E402
from kernels.mx.triton_matmul import (  # noqa: E402
    GemmConfig, GemvConfig, dequant_fp4_bf16, fake_quant_triton, mx_gemm, mx_gemv,
)


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def _problem(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.exp2(torch.randint(-6, 6, (n, 1), generator=g).float())
    w[0, :32] = 0.0                        # a zero block
    w[1, 5] = 40.0                         # one block dominated by a large value
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g)
    return x, quantize_mx(w, "fp4_e2m1"), bias


def _reference(x, wq, bias, act_fmt):
    codes, k = wq.element_codes(), wq.shape[1]
    return naive.mx_linear(x, codes, wq.scales, k, act_fmt=act_fmt, bias=bias)


def check_gemv():
    # N not a multiple of BLOCK_N, K padded (80 -> 96), split-K with a ragged last split.
    for m, n, k, cfg in [(1, 40, 96, GemvConfig(block_n=16, groups=2, split_k=1)),
                         (3, 40, 80, GemvConfig(block_n=16, groups=2, split_k=2)),
                         (2, 33, 224, GemvConfig(block_n=32, groups=2, split_k=3)),
                         (1, 40, 224, GemvConfig(block_n=16, groups=2, split_k=2, prefetch=True))]:
        x, wq, bias = _problem(m, n, k, seed=m * 100 + n)
        for b in (None, bias):
            out = torch.full((m, n), float("nan"))  # poisoned: every element must be written
            mx_gemv(x, wq.codes, wq.scales, k, b, out, cfg)
            err = _rel_err(out, _reference(x, wq, b, None))
            assert err < 1e-5, (m, n, k, cfg, err)
    print("gemv ok")


def check_gemm():
    for m, n, k, cfg in [(5, 40, 96, GemmConfig(block_m=16, block_n=16, groups=1, split_k=1)),
                         (17, 48, 80, GemmConfig(block_m=16, block_n=32, groups=2, split_k=2)),
                         (3, 20, 224, GemmConfig(block_m=16, block_n=16, groups=2, split_k=3))]:
        x, wq, bias = _problem(m, n, k, seed=m * 100 + n)
        for b in (None, bias):
            out = torch.full((m, n), float("nan"))
            mx_gemm(x, wq.codes, wq.scales, k, b, out, cfg)
            err = _rel_err(out, _reference(x, wq, b, None))
            assert err < 1e-5, (m, n, k, cfg, err)
    print("gemm ok")


def check_dequant_kernel():
    for n, k in ((40, 96), (33, 80)):
        _, wq, _ = _problem(1, n, k, seed=n)
        got = dequant_fp4_bf16(wq.codes, wq.scales, k)
        want = naive.dequantize(wq.element_codes(), wq.scales, "fp4_e2m1", 32, k)
        assert got.shape == (n, k) and torch.equal(got.double(), want)
    print("dequant ok")


def check_nan_weight_block():
    x, wq, _ = _problem(2, 24, 64, seed=5)
    w = wq.dequantize(torch.float32)
    w[3, 40] = float("nan")
    wq = quantize_mx(w, "fp4_e2m1")
    for fn, cfg in ((mx_gemv, GemvConfig(block_n=16, groups=2, split_k=2)),
                    (mx_gemm, GemmConfig(block_m=16, block_n=16, groups=1))):
        out = torch.zeros(2, 24)
        fn(x, wq.codes, wq.scales, 64, None, out, cfg)
        assert torch.isnan(out[:, 3]).all() and torch.isfinite(out[:, torch.arange(24) != 3]).all()
    print("nan block ok")


def check_fake_quant_kernel():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(19, 100, generator=g) * torch.exp2(torch.randint(-30, 30, (19, 1), generator=g).float())
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    x[2, :32] = 0.0
    x[3, :32] = 1e-40                     # float32 subnormals
    x[4, :32] = 3e38                      # rounds up past float32's max: falls back to x
    x[5, :32] = -0.0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        xd = x.to(dtype)
        for fmt in ("fp4_e2m1", "fp8_e4m3"):
            for rnd in ("ceil", "floor"):
                got = fake_quant_triton(xd, fmt, 32, rnd)
                want = fake_quant_torch(xd, fmt, 32, rnd)
                same = (got == want) & (torch.signbit(got) == torch.signbit(want))
                same |= torch.isnan(got) & torch.isnan(want)
                if dtype == torch.bfloat16:
                    # The interpreter converts bf16 subnormals to float32 wrongly (9.2e-41 -> 0);
                    # benchmarks/mx.py checks this row on the GPU.
                    same[3] = True
                assert same.all(), (dtype, fmt, rnd, got[~same][:4], want[~same][:4])
    print("fake quant ok")


def check_mx_linear_dispatch():
    x, wq, bias = _problem(3, 40, 96, seed=9)
    x3 = x.reshape(1, 3, 96).float()
    assert matmul_path(x3, wq) == "triton_gemv"
    for act in (None, "fp8_e4m3"):
        with torch.no_grad():
            y = mx_linear(x3, wq, bias, act_fmt=act)
        ref = _reference(x3.reshape(3, 96), wq, bias, act)
        assert y.shape == (1, 3, 40) and y.dtype == torch.float32
        assert _rel_err(y.reshape(3, 40), ref) < 1e-5
    xl = torch.randn(20, 96).to(torch.bfloat16)
    assert matmul_path(xl, wq) == "triton_gemm"
    y = mx_linear(xl, wq, act_fmt="fp8_e4m3")
    assert _rel_err(y, _reference(xl, wq, None, "fp8_e4m3")) < 1e-2  # bf16 output
    print("dispatch ok")


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}

if __name__ == "__main__":
    for name in sys.argv[1:] or list(CHECKS):
        CHECKS[name]()
