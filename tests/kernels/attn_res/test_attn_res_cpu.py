"""kernels.attn_res: the C depth mix against AttnRes's torch path and a float64 reference on the output
and every gradient (sources, pseudo-query, key-norm weight), odd token counts, 2–5 sources; a row's
bits alone and in a batch; the dispatch."""

import pytest
import torch

from k3model.attn_res import AttnRes
from kernels import native
from kernels.attn_res import attn_res_backend, cpu

needs_kernel = pytest.mark.skipif(cpu.load() is None, reason=f"C kernel not built: {cpu.load_error()}")


def _reference_fp64(sources, query, key_weight, eps):
    q = key_weight * query
    logits_NBT = torch.stack([torch.rsqrt(v.pow(2).mean(-1) + eps) * (v * q).sum(-1) for v in sources])
    alpha_NBT = logits_NBT.softmax(0)
    return sum(a.unsqueeze(-1) * v for a, v in zip(alpha_NBT, sources))


def _mix_and_grads(module, sources, dy):
    leaves = [v.clone().requires_grad_() for v in sources]
    module.zero_grad()
    h = module(leaves)
    h.backward(dy)
    return [h.detach()] + [v.grad for v in leaves] + [module.query.grad, module.key_norm.weight.grad]


@needs_kernel
@pytest.mark.parametrize("N, B, T, D", [(2, 3, 63, 64), (3, 2, 17, 128), (5, 1, 1000, 32)])
def test_kernel_matches_the_torch_path_and_fp64_on_output_and_every_gradient(monkeypatch, N, B, T, D):
    torch.manual_seed(N)
    module = AttnRes(D)
    with torch.no_grad():
        module.query.normal_(0.0, 0.3)
        module.key_norm.weight.uniform_(0.5, 1.5)
    sources = [torch.randn(B, T, D) * (1 + i) for i in range(N)]
    dy = torch.randn(B, T, D)
    assert attn_res_backend(sources) == "c"
    got = _mix_and_grads(module, sources, dy)
    monkeypatch.setenv("K3_CPU_KERNELS", "torch")
    torch_path = _mix_and_grads(module, sources, dy)
    src64 = [v.double().requires_grad_() for v in sources]
    q64, w64 = (p.detach().double().requires_grad_() for p in (module.query, module.key_norm.weight))
    h64 = _reference_fp64(src64, q64, w64, module.key_norm.eps)
    h64.backward(dy.double())
    ref = [h64.detach()] + [v.grad for v in src64] + [q64.grad, w64.grad]
    for c_val, t_val, r_val in zip(got, torch_path, ref):
        assert torch.isfinite(c_val).all()
        scale = r_val.abs().max().item()
        # The C path is as close to float64 as the torch path is (both ~1e-6 here: the logits are large).
        c_err, t_err = ((c_val.double() - r_val).abs().max().item() / scale,
                        (t_val.double() - r_val).abs().max().item() / scale)
        assert c_err < max(4 * t_err, 1e-6), (c_err, t_err)


@needs_kernel
def test_a_token_gets_the_same_bits_alone_and_in_a_batch():
    torch.manual_seed(3)
    module = AttnRes(64)
    with torch.no_grad():
        module.query.normal_()
    sources = [torch.randn(5, 7, 64) for _ in range(3)]
    with torch.no_grad():
        h = module(sources)
        for b in range(5):
            assert torch.equal(module([v[b:b + 1, 2:5] for v in sources]), h[b:b + 1, 2:5])


def test_dispatch(monkeypatch):
    x = torch.randn(2, 5, 16)
    expected = "c" if cpu.load() is not None else "torch"
    assert attn_res_backend([x, x]) == expected
    assert attn_res_backend([x]) == "torch"  # one source: no mix
    assert attn_res_backend([x, torch.randn(2, 5, 12)]) == "torch"  # shapes differ
    assert attn_res_backend([torch.randn(2, 5, 12)] * 2) == "torch"  # width not a multiple of 8
    assert attn_res_backend([x.double(), x.double()]) == "torch"
    monkeypatch.setenv("K3_CPU_KERNELS", "torch")
    assert attn_res_backend([x, x]) == "torch"


def test_without_a_compiler_the_torch_path_is_taken_and_forcing_the_kernel_says_why(monkeypatch):
    monkeypatch.setattr(native, "_LIBS", {})
    monkeypatch.setattr(native, "_ERRORS", {})
    monkeypatch.setattr(native, "compiler", lambda: None)
    x = torch.randn(2, 5, 16)
    assert attn_res_backend([x, x]) == "torch"
    monkeypatch.setenv("K3_CPU_KERNELS", "c")
    with pytest.raises(ValueError, match="could not be built: no C compiler"):
        attn_res_backend([x, x])
