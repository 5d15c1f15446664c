"""The Triton AttnRes mix (kernels/attn_res/triton.py) on a CUDA GPU at the model's size: M = 32,768
rows, D = 1024, N = 2 and 3 sources; h and every gradient (sources, pseudo-query, key norm weight)
against autograd of AttnRes's torch path (`AttnRes._mix_torch`) on fp32 copies of the same numbers,
as relative RMS error ‖a − b‖ / ‖b‖; the op inside torch.compile(fullgraph=True); a K3Model's AttnRes
through the module (the Triton op) and through the torch path. Skipped without CUDA (CI has none);
run on the H200 with `pytest tests/kernels/attn_res/test_attn_res_triton_gpu.py`.

Tolerances: bf16 sources 1e-2 on h and the sources' gradients (stored in bf16: 2⁻⁹ relative
rounding, ~1.5e-3 RMS in the interpreter). fp32 1e-5 on h and the sources' gradients: the
interpreter at this very size (N = 3, fp32) gave 3e-7 on h and 1.5e-6 on dv, as far from a float64
reference as the fp32 torch path is (the logits here are large, so α's rounding shows). The query's
and key norm's gradients (fp32 in every case) sum N·M ≈ 98k terms per column, which the kernel adds
a few rows per program and torch then over the programs, the reference pairwise: 1.6e-6 in the
interpreter (16 rows a program) (from float64: 1.3e-6, the torch path's 1.4e-6), so the sum's order adds little to the
rows' own rounding; 5e-5 leaves room for the GPU's approximate exp/rsqrt and other reduction orders,
and a wrong or missing term is O(1) off.
"""

import copy
from dataclasses import replace

import pytest
import torch

from k3model.attn_res import AttnRes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

M, D = 32768, 1024
NAMES = ["h", "dv0", "dv1", "dv2", "dquery", "dkey_weight"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make_module(d: int, seed: int) -> AttnRes:
    torch.manual_seed(seed)
    module = AttnRes(d).cuda()
    with torch.no_grad():  # a nonzero query, so α is not uniform
        module.query.normal_(0.0, 0.5)
        module.key_norm.weight.uniform_(0.5, 1.5)
    return module


def make_inputs(N: int, dtypes: list[torch.dtype], seed: int, rows: int = M, d: int = D):
    """Sources of scales 1..N in their dtypes, and dh in the first one's (h's dtype)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sources = [(torch.randn(rows, d, device="cuda", generator=gen) * (1 + i)).to(dtypes[i]) for i in range(N)]
    dh = torch.randn(rows, d, device="cuda", generator=gen).to(dtypes[0])
    return sources, dh


def run(mix, module: AttnRes, sources, dh):
    leaves = [v.clone().requires_grad_(True) for v in sources]
    module.zero_grad(set_to_none=True)
    h = mix(leaves)
    h.backward(dh)
    return [h.detach()] + [v.grad for v in leaves] + [module.query.grad.clone(), module.key_norm.weight.grad.clone()]


def triton_mix(module: AttnRes):
    from kernels.attn_res import attn_res_mix_triton

    return lambda xs: attn_res_mix_triton(xs, module.query, module.key_norm.weight, module.key_norm.eps)


def names(N: int) -> list[str]:
    return NAMES[:1 + N] + NAMES[-2:]


@pytest.mark.parametrize("N", [2, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_h_and_every_gradient_match_the_fp32_torch_path(N, dtype):
    module = make_module(D, seed=N)
    sources, dh = make_inputs(N, [dtype] * N, seed=N)
    # NaN-filled caching-allocator memory beforehand, which the outputs are likely to reuse: an
    # element the kernels forget to write then shows up.
    torch.empty(8 * M * D, device="cuda").fill_(float("nan"))
    got = run(triton_mix(module), module, sources, dh)
    want = run(module._mix_torch, module, [v.float() for v in sources], dh.float())
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    errors = {n: rel(a, b) for n, a, b in zip(names(N), got, want)}
    for name, a in zip(names(N), got):
        assert torch.isfinite(a).all(), name
        assert a.dtype == (dtype if name.startswith(("h", "dv")) else torch.float32), name
        assert errors[name] <= (5e-5 if name in ("dquery", "dkey_weight") else tol), errors


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_op_inside_torch_compile_fullgraph_gives_the_eager_gradients(dynamic):
    torch._dynamo.reset()
    module = make_module(D, seed=11)
    sources, dh = make_inputs(3, [torch.float32, torch.bfloat16, torch.bfloat16], seed=11, rows=4096)
    mix = triton_mix(module)
    eager = run(mix, module, sources, dh)
    compiled = run(torch.compile(mix, fullgraph=True, dynamic=dynamic), module, sources, dh)
    for name, a, b in zip(names(3), compiled, eager):
        # The same kernels on the same numbers; the query's gradients through γ ⊙ w are one product.
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0.0, msg=name)


def test_a_model_block_attn_res_on_cuda_gives_the_torch_path_h_and_gradients(monkeypatch):
    """A K3Model's AttnRes on the sources it really gets under bf16 autocast (the fp32 embedding and
    bf16 block sums, captured by a hook): the module (the Triton op) against its torch path."""
    import k3model.attn_res
    from k3model.config import get_profile
    from k3model.model import K3Model

    calls = []
    op = k3model.attn_res.attn_res_mix_triton
    monkeypatch.setattr(k3model.attn_res, "attn_res_mix_triton", lambda *a: calls.append(1) or op(*a))

    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0)
    torch.manual_seed(0)
    model = K3Model(cfg).cuda()
    module = model.final_res
    captured = []
    module.register_forward_pre_hook(lambda mod, args: captured.append([v.detach() for v in args[0]]))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        model(torch.randint(0, cfg.vocab_size, (2, 96), device="cuda"))
    sources = captured[0]
    assert len(sources) >= 2, [v.dtype for v in sources]
    module = copy.deepcopy(module)
    with torch.no_grad():
        module.query.normal_(0.0, 0.5)
    dh = torch.randn_like(sources[0])
    got = run(module, module, sources, dh)
    assert calls, "the module did not take the Triton op"
    want = run(module._mix_torch, module, sources, dh)
    for i, (a, b) in enumerate(zip(got, want)):
        # bf16 tensors (sources' gradients) may round one ulp apart; fp32 ones agree to fp32 rounding.
        assert a.dtype == b.dtype and torch.isfinite(a).all(), i
        assert rel(a, b) <= (1e-2 if a.dtype == torch.bfloat16 else 5e-5), (i, rel(a, b))


@pytest.mark.parametrize("rows, d", [(4099, 1000), (1027, 8192)])
def test_odd_and_wide_rows(rows, d):
    """A width that is no power of two (masked columns) and one past MAX_BLOCK_D (the two-pass loop
    over D chunks, with the backward's dwq partial sums added chunk by chunk), odd row counts."""
    module = make_module(d, seed=d)
    sources, dh = make_inputs(3, [torch.bfloat16] * 3, seed=d, rows=rows, d=d)
    got = run(triton_mix(module), module, sources, dh)
    want = run(module._mix_torch, module, [v.float() for v in sources], dh.float())
    errors = {n: rel(a, b) for n, a, b in zip(names(3), got, want)}
    for name, a in zip(names(3), got):
        assert torch.isfinite(a).all(), name
        assert errors[name] <= (1e-4 if name in ("dquery", "dkey_weight") else 1e-2), errors
