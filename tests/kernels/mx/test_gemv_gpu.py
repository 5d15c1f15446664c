"""The MXFP4 GEMV kernels on a CUDA GPU (skipped without one): the inline-PTX paths the interpreter
cannot run, against their plain-Triton forms and the float64 reference.

    python3 -m pytest -q tests/kernels/mx/test_gemv_gpu.py      (on the H200)
"""

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

import triton.language as tl  # noqa: E402

from kernels.mx import naive, quantize_mx, unpack_fp4  # noqa: E402
from kernels.mx import triton_matmul as tm  # noqa: E402


@triton.jit
def _word_pairs_kernel(w_ptr, out_ptr, BLOCK: tl.constexpr, ASM: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    p04, p15, p26, p37 = tm._e2m1_word_pairs(tl.load(w_ptr + offs), ASM)
    tl.store(out_ptr + offs * 4, p04)
    tl.store(out_ptr + offs * 4 + 1, p15)
    tl.store(out_ptr + offs * 4 + 2, p26)
    tl.store(out_ptr + offs * 4 + 3, p37)


def test_ptx_decode_equals_the_triton_decode():
    """_e2m1_word_pairs' inline PTX (lop3) gives the bits of its plain Triton form on every word
    made of the 16 codes in each nibble (all 2^16 low halves x 4 high-half patterns, and random words)."""
    lo = torch.arange(1 << 16, dtype=torch.int64)
    words = torch.cat([lo | (h << 16) for h in (0, 0x8000, 0x7777, 0xFFFF)]
                      + [torch.randint(0, 1 << 32, (1 << 16,), dtype=torch.int64)])
    w = (words - (words >= 2**31).long() * 2**32).to(torch.int32).cuda()  # the same 32 bits as int32
    outs = []
    for asm in (True, False):
        out = torch.empty(w.numel() * 4, dtype=torch.int32, device="cuda")
        _word_pairs_kernel[(w.numel() // 1024,)](w, out, BLOCK=1024, ASM=asm)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def _stack(e, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    wqs = [quantize_mx(torch.randn(n, k, device="cuda", generator=g) / k**0.5, "fp4_e2m1") for _ in range(e)]
    return wqs, torch.stack([w.codes for w in wqs]), torch.stack([w.scales for w in wqs])


@pytest.mark.parametrize("n,k", [(3072, 3584), (3584, 3072), (7168, 7168), (1000, 1000)])
def test_default_gemv_within_its_bound(n, k):
    """mx_gemv with default_gemv_config at M = 1 and 3 against float64, within gemv_error_bound."""
    (wq,), _, _ = _stack(1, n, k, seed=n + k)
    w = naive.dequantize(unpack_fp4(wq.codes), wq.scales, "fp4_e2m1", 32, k)
    for m in (1, 3):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        cfg = tm.default_gemv_config(n, k, x.device)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        tm.mx_gemv(x, wq.codes, wq.scales, k, None, out, cfg)
        bound = tm.gemv_error_bound(x, w, wq.scales, cfg.accumulate, None, out.dtype, cfg.loop, cfg.groups)
        err = (out.double() - x.double() @ w.T).abs()
        assert bool((err <= bound).all()), (n, k, m, (err / bound).max().item())


@pytest.mark.parametrize("n,k,shared_x", [(3072, 3584, True), (3584, 3072, False), (1000, 1000, False)])
def test_grouped_gemv_equals_one_launch_per_expert(n, k, shared_x):
    """mx_gemv_grouped (its default config) gives, row by row, the bits of mx_gemv with the same
    config on that row's expert, for 16 routed experts of a stack of 20 (one token shared by all, or
    one row each); and within the bound of the float64 reference."""
    wqs, codes, scales = _stack(20, n, k, seed=k)
    ids = torch.randperm(20, generator=torch.Generator().manual_seed(1))[:16].to(torch.int32).cuda()
    x = torch.randn(1 if shared_x else 16, k, device="cuda").to(torch.bfloat16).expand(16, k)
    out = torch.full((16, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    tm.mx_gemv_grouped(x, codes, scales, ids, k, out)
    cfg = tm.default_grouped_gemv_config(n, k, 16, x.device)
    for j, e in enumerate(ids.tolist()):
        alone = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        tm.mx_gemv(x[j:j + 1].contiguous(), codes[e], scales[e], k, None, alone, cfg)
        assert torch.equal(out[j:j + 1], alone), (j, e)
        w = naive.dequantize(unpack_fp4(codes[e]), scales[e], "fp4_e2m1", 32, k)
        bound = tm.gemv_error_bound(x[j:j + 1], w, scales[e], "f16x2", None, out.dtype, "elementwise", cfg.groups)
        assert bool(((out[j:j + 1].double() - x[j:j + 1].double() @ w.T).abs() <= bound).all()), (j, e)

