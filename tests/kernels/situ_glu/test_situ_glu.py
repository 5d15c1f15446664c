"""kernels.situ_glu: the fused C kernel against the torch formula and an fp64 reference, on outputs
and both gradients; odd lengths, extreme and non-finite inputs; bits independent of the batch."""

import pytest
import torch

from kernels import native
from kernels.situ_glu import cpu, situ_glu, situ_glu_backend, situ_glu_torch

B1, B2 = 4.0, 25.0

needs_kernel = pytest.mark.skipif(cpu.load() is None, reason=f"C kernel not built: {cpu.load_error()}")


def fp64_reference(g, v):
    g, v = g.double(), v.double()
    return B1 * torch.tanh(g / B1) * torch.sigmoid(g) * B2 * torch.tanh(v / B2)


@needs_kernel
@pytest.mark.parametrize("shape", [(63,), (1000, 7), (3, 64, 128)])
def test_kernel_matches_torch_and_fp64_on_outputs_and_gradients(shape):
    torch.manual_seed(0)
    g = (torch.randn(shape) * 4).requires_grad_()
    v = (torch.randn(shape) * 20).requires_grad_()
    dy = torch.randn(shape)
    grads = {}
    for name, fn in (("cpu", cpu.situ_glu_cpu), ("torch", situ_glu_torch), ("fp64", None)):
        g.grad = v.grad = None
        y = fp64_reference(g, v) if fn is None else fn(g, v, B1, B2)
        y.backward(dy if fn is not None else dy.double())
        grads[name] = (y.detach().double(), g.grad.double(), v.grad.double())
    for (y, dg, dv), (yt, dgt, dvt), (yr, dgr, dvr) in [(grads["cpu"], grads["torch"], grads["fp64"])]:
        for got, torch_path, ref in ((y, yt, yr), (dg, dgt, dgr), (dv, dvt, dvr)):
            scale = ref.abs().max()
            # relative to the tensor's largest value: the torch path's own error is ~2e-7 on this scale
            assert (got - ref).abs().max() / scale < 1e-6
            assert (torch_path - ref).abs().max() / scale < 1e-6
            torch.testing.assert_close(got, torch_path, rtol=1e-5, atol=2e-6 * scale.item())


@needs_kernel
def test_extremes_saturate_and_non_finite_inputs_propagate():
    g = torch.tensor([0.0, 1e-5, -1e-5, 50.0, -50.0, 100.0, -100.0, 1e4, float("inf"), float("-inf"), float("nan"), 1.0])
    v = torch.tensor([1e4, -1e4, 3.0, 0.0, 1.0, -1e4, 1e4, 2.0, 1.0, 1.0, 1.0, float("nan")])
    got = cpu.situ_glu_cpu(g, v, B1, B2)
    ref = situ_glu_torch(g, v, B1, B2)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-30, equal_nan=True)
    assert got.abs().nan_to_num(0.0).max() <= B1 * B2
    assert got[-2:].isnan().all()


@needs_kernel
def test_a_row_gets_the_same_bits_whatever_surrounds_it():
    torch.manual_seed(1)
    g, v = torch.randn(37, 53) * 5, torch.randn(37, 53) * 30
    whole = cpu.situ_glu_cpu(g, v, B1, B2)
    for r in (0, 5, 36):
        assert torch.equal(cpu.situ_glu_cpu(g[r:r + 1], v[r:r + 1], B1, B2), whole[r:r + 1])
    # and at an unaligned start (a vector body in one call, the padded tail in the other)
    assert torch.equal(cpu.situ_glu_cpu(g.flatten()[3:], v.flatten()[3:], B1, B2), whole.flatten()[3:])


@needs_kernel
def test_dispatch_takes_the_kernel_on_cpu_keeps_dtype_and_honours_the_override(monkeypatch):
    g16 = torch.randn(8, 16, dtype=torch.bfloat16)
    v16 = torch.randn(8, 16, dtype=torch.bfloat16)
    assert situ_glu_backend(g16) == "c"
    out = situ_glu(g16, v16, B1, B2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, situ_glu_torch(g16, v16, B1, B2), rtol=1e-2, atol=1e-2)
    monkeypatch.setenv("K3_CPU_KERNELS", "torch")
    assert situ_glu_backend(g16) == "torch"
    assert torch.equal(situ_glu(g16, v16, B1, B2), situ_glu_torch(g16, v16, B1, B2))
    monkeypatch.setenv("K3_CPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="K3_CPU_KERNELS must be one of"):
        situ_glu_backend(g16)


def test_without_a_compiler_the_torch_path_is_taken_and_forcing_the_kernel_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_LIBS", {})
    monkeypatch.setattr(native, "_ERRORS", {})
    monkeypatch.setattr(native, "compiler", lambda: None)
    monkeypatch.setenv("K3_KERNEL_CACHE", str(tmp_path))
    x = torch.randn(4)
    assert situ_glu_backend(x) == "torch"
    assert "no C compiler" in cpu.load_error()
    monkeypatch.setenv("K3_CPU_KERNELS", "c")
    with pytest.raises(ValueError, match="could not be built: no C compiler"):
        situ_glu_backend(x)


def test_mismatched_shapes_are_refused():
    if cpu.load() is None:
        pytest.skip(f"C kernel not built: {cpu.load_error()}")
    with pytest.raises(ValueError, match="one shape"):
        cpu.situ_glu_cpu(torch.randn(3, 4), torch.randn(4, 3), B1, B2)
