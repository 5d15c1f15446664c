"""kernels.kda.cpu.kda_l2_norm_cpu: the C L2 norm of KDA's q/k against the layer's torch formula and
float64 on output and gradient, rows at and below the clamp included; a row's bits alone."""

import pytest
import torch

from k3model.kda_layer import _l2_normalize
from kernels.kda import cpu

needs_kernel = pytest.mark.skipif(cpu.load_l2_norm() is None, reason="C kernel not built")


@needs_kernel
@pytest.mark.parametrize("shape", [(2, 63, 4, 32), (1, 1000, 2, 8), (3, 5, 1, 128)])
def test_kernel_matches_torch_and_fp64_on_output_and_gradient(shape):
    torch.manual_seed(shape[-1])
    x = torch.randn(shape) * 2
    x[0, 0, 0] = 1e-8  # under the clamp: ‖x‖ < ε
    dy = torch.randn(shape)
    outs = []
    for fn in (cpu.kda_l2_norm_cpu, _l2_normalize):
        leaf = x.clone().requires_grad_()
        y = fn(leaf, 1e-6)
        y.backward(dy)
        outs.append((y.detach(), leaf.grad))
    x64 = x.double().requires_grad_()
    y64 = torch.nn.functional.normalize(x64, dim=-1, eps=1e-6)
    y64.backward(dy.double())
    for got, ref_t, ref64 in zip(outs[0], outs[1], (y64.detach(), x64.grad)):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, ref_t, rtol=1e-5, atol=1e-6 * ref_t.abs().max().item())
        assert ((got.double() - ref64).abs() / ref64.abs().amax(-1, keepdim=True)).max() < 1e-6


@needs_kernel
def test_a_row_gets_the_same_bits_alone():
    torch.manual_seed(2)
    x = torch.randn(4, 7, 2, 16)
    y = cpu.kda_l2_norm_cpu(x, 1e-6)
    assert torch.equal(cpu.kda_l2_norm_cpu(x[2:3, 4:6], 1e-6), y[2:3, 4:6])
