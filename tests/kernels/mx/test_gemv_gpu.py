"""The MXFP4 GEMV on a CUDA GPU (skipped without one): the inline-PTX paths the interpreter cannot run,
against their plain-Triton forms and the float64 reference, and the cached launches of the eager
decode path (gemv_decode, gemv_grouped_decode) against the plain launch.

    python3 -m pytest -q tests/kernels/mx/test_gemv_gpu.py      (on the H200)
"""

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

import triton.language as tl  # noqa: E402

from kernels.mx import mx_linear, mx_linear_experts, naive, quantize_mx, unpack_fp4  # noqa: E402
from kernels.mx.triton import gemv as tm  # noqa: E402


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
        bound = tm.gemv_error_bound(x, w, wq.scales, None, out.dtype)
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
        bound = tm.gemv_error_bound(x[j:j + 1], w, scales[e], None, out.dtype)
        assert bool(((out[j:j + 1].double() - x[j:j + 1].double() @ w.T).abs() <= bound).all()), (j, e)



@pytest.mark.parametrize("n,k,bias", [(7168, 7168, False), (3072, 3584, True), (1000, 1000, True)])
def test_cached_decode_launch_equals_the_plain_launch(n, k, bias):
    """mx_linear's CUDA GEMV path (gemv_decode: launches through the compiled launcher, cached per
    weight and call shape) gives the bits of mx_gemv with the default config, on the first call (which
    compiles and fills the cache), on repeated calls, with x at another address and misaligned (a
    view one element in, so x goes through the padded copy), at M = 1 and 3, and for a second weight
    of the same shape (a different cache entry); under no_grad."""
    (wq, wq2), _, _ = _stack(2, n, k, seed=n + 2 * k)
    b = torch.randn(n, device="cuda").to(torch.bfloat16) if bias else None
    tm._PLANS.clear()
    with torch.no_grad():
        for m in (1, 3):
            for w in (wq, wq2):
                for attempt in range(3):
                    buf = torch.randn(m * k + 1, device="cuda").to(torch.bfloat16)
                    x = buf[1:].reshape(m, k) if attempt == 2 else buf[: m * k].reshape(m, k)
                    want = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    tm.mx_gemv(x.contiguous(), w.codes, w.scales, k, b, want, tm.default_gemv_config(n, k, x.device))
                    got = mx_linear(x, w, b)
                    assert torch.equal(got, want), (m, attempt, (got.float() - want.float()).abs().max().item())
    assert len(tm._PLANS) >= 4  # (M, weight) pairs, plus the misaligned x's own


def test_cached_grouped_decode_equals_the_plain_launch_and_marks_bad_ids():
    """mx_linear_experts on CUDA (gemv_grouped_decode, cached) gives the bits of mx_gemv_grouped, for a
    shared (stride-0) row and one row per expert, on first and later calls with new ids; an id outside
    [0, E) gives a NaN row and leaves the others intact (no host check on CUDA)."""
    _, codes, scales = _stack(20, 3072, 3584, seed=3)
    stack = quantize_mx(torch.zeros(1, 1, 32, device="cuda"), "fp4_e2m1")
    import dataclasses

    stack = dataclasses.replace(stack, codes=codes, scales=scales, shape=(20, 3072, 3584))
    tm._PLANS.clear()
    with torch.no_grad():
        for call in range(3):
            ids = torch.randperm(20, generator=torch.Generator().manual_seed(call))[:16].to(torch.int32).cuda()
            for shared in (True, False):
                x = torch.randn(1 if shared else 16, 3584, device="cuda").to(torch.bfloat16).expand(16, 3584)
                want = torch.full((16, 3072), float("nan"), device="cuda", dtype=torch.bfloat16)
                tm.mx_gemv_grouped(x, codes, scales, ids, 3584, want)
                got = mx_linear_experts(x, stack, ids)
                assert torch.equal(got, want), (call, shared)
        bad = ids.clone()
        bad[3] = 20
        got = mx_linear_experts(x, stack, bad)
        assert torch.isnan(got[3]).all() and torch.equal(got[torch.arange(16) != 3], want[torch.arange(16) != 3])
