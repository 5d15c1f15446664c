"""kernels.rms_norm: the C RMSNorm against k3model's torch Function and float64 on the output and both
gradients (odd row counts, widths 8–384, small and large scales); a row's bits alone and in a batch;
the dispatch."""

import pytest
import torch

from k3model.common import RMSNorm
from kernels import native
from kernels.rms_norm import cpu, rms_norm_backend

needs_kernel = pytest.mark.skipif(cpu.load() is None, reason=f"C kernel not built: {cpu.load_error()}")


def _norm_and_grads(norm, x, dy):
    leaf = x.clone().requires_grad_()
    norm.zero_grad()
    y = norm(leaf)
    y.backward(dy)
    return y.detach(), leaf.grad, norm.weight.grad


@needs_kernel
@pytest.mark.parametrize("shape, scale", [((3, 63, 64), 1.0), ((1000, 8), 30.0), ((2, 5, 384), 1e-3)])
def test_kernel_matches_the_torch_function_and_fp64(monkeypatch, shape, scale):
    torch.manual_seed(shape[-1])
    norm = RMSNorm(shape[-1], eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x, dy = torch.randn(shape) * scale, torch.randn(shape)
    assert rms_norm_backend(x, norm.weight) == "c"
    got = _norm_and_grads(norm, x, dy)
    monkeypatch.setenv("K3_CPU_KERNELS", "torch")
    torch_path = _norm_and_grads(norm, x, dy)
    x64, w64 = x.double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    y64.backward(dy.double())
    for c_val, t_val, r_val in zip(got, torch_path, (y64.detach(), x64.grad, w64.grad)):
        assert torch.isfinite(c_val).all()
        torch.testing.assert_close(c_val, t_val, rtol=1e-5, atol=1e-6 * t_val.abs().max().item())
        assert (c_val.double() - r_val).abs().max() / r_val.abs().max() < 1e-6


@needs_kernel
def test_a_row_gets_the_same_bits_alone_and_in_a_batch():
    torch.manual_seed(1)
    norm = RMSNorm(32)
    x = torch.randn(6, 9, 32)
    with torch.no_grad():
        y = norm(x)
        for b in range(6):
            assert torch.equal(norm(x[b:b + 1, 3:4]), y[b:b + 1, 3:4])


def test_dispatch(monkeypatch):
    w = torch.ones(16)
    expected = "c" if cpu.load() is not None else "torch"
    assert rms_norm_backend(torch.randn(4, 16), w) == expected
    assert rms_norm_backend(torch.randn(4, 12), torch.ones(12)) == "torch"  # width not a multiple of 8
    assert rms_norm_backend(torch.randn(4, 16).double(), w.double()) == "torch"
    assert rms_norm_backend(torch.randn(4, 16).bfloat16(), w) == "torch"
    monkeypatch.setenv("K3_CPU_KERNELS", "torch")
    assert rms_norm_backend(torch.randn(4, 16), w) == "torch"


def test_without_a_compiler_the_torch_path_is_taken_and_forcing_the_kernel_says_why(monkeypatch):
    monkeypatch.setattr(native, "_LIBS", {})
    monkeypatch.setattr(native, "_ERRORS", {})
    monkeypatch.setattr(native, "compiler", lambda: None)
    assert rms_norm_backend(torch.randn(4, 16), torch.ones(16)) == "torch"
    monkeypatch.setenv("K3_CPU_KERNELS", "c")
    with pytest.raises(ValueError, match="could not be built: no C compiler"):
        rms_norm_backend(torch.randn(4, 16), torch.ones(16))
