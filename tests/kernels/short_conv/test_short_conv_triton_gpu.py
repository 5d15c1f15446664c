"""The Triton short conv + SiLU (+ per-head L2 norm) on CUDA at training sizes, against the float64
torch reference (the tap sum of `naive.py` and the torch L2 formula, autograd): outputs and both
gradients by relative error ‖a − b‖ / ‖b‖; the op inside torch.compile; the dispatch of
`kernels.short_conv` and the KDA layer's training path. Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch
from short_conv_references import outputs_and_grads, reference, rel

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-5}


@pytest.mark.parametrize("shape", [(64, 512, 1024), (1, 65536, 1024), (3, 1000, 256)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [128, 0])
def test_outputs_and_both_gradients_against_fp64(shape, dtype, head_dim):
    from kernels.short_conv.triton import short_conv_silu_triton

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    w = torch.randn(shape[-1], 1, 4, device="cuda", generator=gen) * 0.5
    dy = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    got = outputs_and_grads(lambda a, b: short_conv_silu_triton(a, b, head_dim), x, w, dy)
    ref = outputs_and_grads(lambda a, b: reference(a, b, head_dim), x.double(), w.double(), dy.double())
    assert [g.dtype for g in got] == [dtype, dtype, torch.float32]
    for name, g, r in zip(["y", "dx", "dw"], got, ref):
        assert torch.isfinite(g).all(), name
        assert rel(g, r) <= TOL[dtype], (name, rel(g, r))


def test_inside_torch_compile_gradients_equal_eager():
    from kernels.short_conv.triton import short_conv_silu_triton

    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(4, 256, 512, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = torch.randn(512, 1, 4, device="cuda", generator=gen)
    g = torch.randn(4, 256, 512, device="cuda", generator=gen)

    def loss(a, b):
        return (short_conv_silu_triton(a, b, 128).float() * g).sum()

    torch._dynamo.reset()
    results = []
    for fn in (loss, torch.compile(loss, fullgraph=True)):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(a, b).backward()
        results.append((a.grad, b.grad))
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


@pytest.mark.parametrize("T", [2, 100])
def test_dispatch_and_new_state(T):
    """CUDA without a state takes the Triton path; its new state (the last W − 1 inputs, zeros on the
    left when T < W − 1) equals the reference's; a state given keeps the torch path."""
    from kernels.short_conv import short_conv_backend, short_conv_silu
    from kernels.short_conv.naive import short_conv_silu_torch

    x = torch.randn(2, T, 256, device="cuda")
    w = torch.randn(256, 1, 4, device="cuda") * 0.5
    assert short_conv_backend(x) == "triton"
    assert short_conv_backend(x, torch.zeros(2, 256, 3, device="cuda")) == "torch"
    y, state = short_conv_silu(x, w)
    ref_y, ref_state = short_conv_silu_torch(x, w, None)
    assert torch.equal(state, ref_state)
    assert rel(y, ref_y) <= 1e-3  # cudnn's conv1d may take tf32 products


@pytest.mark.parametrize("autocast", [False, True])
def test_kda_layer_training_path_matches_the_state_path(autocast):
    """The layer's fused q/k path (no state, CUDA) against the same forward from a zero state, which
    keeps the two-step conv and L2 norm: output and gradients."""
    from k3model.config import KDAConfig
    from k3model.kda_layer import KDALayer

    torch.manual_seed(2)
    layer = KDALayer(KDAConfig(d_model=256, n_heads=2, head_dim=128)).cuda()
    x = torch.randn(2, 100, 256, device="cuda")
    results = []
    for zero_state in (False, True):
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y, _ = layer(xi, layer.empty_state(2, "cuda", torch.float32) if zero_state else None)
        y.float().square().sum().backward()
        results.append([y.detach(), xi.grad, layer.q_conv.weight.grad, layer.k_conv.weight.grad,
                         layer.v_conv.weight.grad])
    for name, fused, two_step in zip(["y", "dx", "dw_q", "dw_k", "dw_v"], *results):
        assert rel(fused, two_step) <= 2e-2, (name, rel(fused, two_step))
