"""kernels.short_conv: the C kernel against the conv1d path on outputs, new state and both gradients
(odd lengths, a state, prompts shorter than the window, tap counts other than 4); the dispatch, a
window wider than the kernel holds going to the torch path; rows independent of the batch."""

import pytest
import torch

from kernels import native
from kernels.short_conv import cpu, short_conv_backend, short_conv_silu, short_conv_silu_torch

needs_kernel = pytest.mark.skipif(cpu.load() is None, reason=f"C kernel not built: {cpu.load_error()}")


def kernel_and_conv1d(B: int, T: int, C: int, W: int, with_state: bool):
    """(C kernel, conv1d path) on the same random inputs: each (y, new state, dx, dw)."""
    x = torch.randn(B, T, C, requires_grad=True)
    w = (torch.randn(C, 1, W) * 0.5).requires_grad_()
    state = torch.randn(B, C, W - 1) if with_state else None
    dy = torch.randn(B, T, C)
    results = []
    for fn in (cpu.short_conv_silu_cpu, short_conv_silu_torch):
        x.grad = w.grad = None
        y, new_state = fn(x, w, state)
        y.backward(dy)
        results.append((y.detach(), new_state, x.grad, w.grad))
    return results


@needs_kernel
@pytest.mark.parametrize("B, T, C, with_state", [(2, 63, 64, False), (3, 2, 16, True), (2, 1000, 8, False),
                                                 (2, 17, 24, True)])
def test_kernel_matches_conv1d_on_outputs_state_and_gradients(B, T, C, with_state):
    torch.manual_seed(0)
    results = kernel_and_conv1d(B, T, C, 4, with_state)
    for got, ref in zip(*results):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())
    assert results[0][0].is_contiguous()


@needs_kernel
@pytest.mark.parametrize("W, C, with_state", [(2, 24, True), (3, 40, False), (7, 16, True)])
def test_other_tap_counts_match_conv1d(W, C, with_state):
    """Beyond Kimi's 4 taps: the C kernel's general tap count, a last 8-channel block beside 16-channel ones."""
    torch.manual_seed(W)
    for got, ref in zip(*kernel_and_conv1d(2, 19, C, W, with_state)):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


def test_more_taps_than_the_kernel_holds_take_the_torch_path():
    torch.manual_seed(0)
    x, w = torch.randn(2, 30, 16), torch.randn(16, 1, cpu.MAX_TAPS + 1)
    assert short_conv_backend(x, taps=cpu.MAX_TAPS + 1) == "torch"
    y, state = short_conv_silu(x, w)
    ref_y, ref_state = short_conv_silu_torch(x, w, None)
    assert torch.equal(y, ref_y) and torch.equal(state, ref_state)


@needs_kernel
def test_weight_gradient_matches_fp64():
    torch.manual_seed(2)
    x = torch.randn(4, 512, 32)
    w = (torch.randn(32, 1, 4) * 0.5).requires_grad_()
    dy = torch.randn(4, 512, 32)
    y, _ = cpu.short_conv_silu_cpu(x, w, None)
    y.backward(dy)
    w64 = w.detach().double().requires_grad_()
    y64, _ = short_conv_silu_torch(x.double(), w64, None)
    y64.backward(dy.double())
    assert ((w.grad.double() - w64.grad).abs().max() / w64.grad.abs().max()) < 1e-6


@needs_kernel
def test_a_row_gets_the_same_bits_alone():
    torch.manual_seed(1)
    x, w, state = torch.randn(5, 9, 16), torch.randn(16, 1, 4), torch.randn(5, 16, 3)
    y, _ = cpu.short_conv_silu_cpu(x, w, state)
    for b in range(5):
        assert torch.equal(cpu.short_conv_silu_cpu(x[b:b + 1], w, state[b:b + 1])[0], y[b:b + 1])


@needs_kernel
def test_dispatch(monkeypatch):
    x = torch.randn(2, 5, 16)
    assert short_conv_backend(x) == "c"
    assert short_conv_backend(torch.randn(2, 5, 12)) == "torch"  # channels not a multiple of 8
    assert short_conv_backend(x.double()) == "torch"
    assert short_conv_backend(x, torch.randn(2, 16, 3, requires_grad=True)) == "torch"
    monkeypatch.setenv("K3_CPU_KERNELS", "torch")
    w = torch.randn(16, 1, 4)
    assert short_conv_backend(x) == "torch"
    y, s = short_conv_silu(x, w)
    ref_y, ref_s = short_conv_silu_torch(x, w, None)
    assert torch.equal(y, ref_y) and torch.equal(s, ref_s)


def test_without_a_compiler_the_torch_path_is_taken_and_forcing_the_kernel_says_why(monkeypatch):
    monkeypatch.setattr(native, "_LIBS", {})
    monkeypatch.setattr(native, "_ERRORS", {})
    monkeypatch.setattr(native, "compiler", lambda: None)
    x = torch.randn(2, 5, 16)
    assert short_conv_backend(x) == "torch"
    monkeypatch.setenv("K3_CPU_KERNELS", "c")
    with pytest.raises(ValueError, match="could not be built: no C compiler"):
        short_conv_backend(x)


@pytest.mark.parametrize("T, with_state", [(33, False), (2, True), (9, True)])
def test_the_tap_sum_matches_conv1d_and_compiles_to_it(T, with_state):
    """The compiled regions' path: the shifted-product sum against conv1d eagerly (outputs, state,
    both gradients), and the compiled module takes it."""
    from kernels.short_conv.naive import short_conv_silu_taps

    torch.manual_seed(3)
    x = torch.randn(2, T, 16, requires_grad=True)
    w = (torch.randn(16, 1, 4) * 0.5).requires_grad_()
    state = torch.randn(2, 16, 3) if with_state else None
    dy = torch.randn(2, T, 16)
    results = []
    for fn in (short_conv_silu_taps, short_conv_silu_torch):
        x.grad = w.grad = None
        y, new_state = fn(x, w, state)
        y.backward(dy)
        results.append((y.detach(), new_state, x.grad, w.grad))
    for got, ref in zip(*results):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())

    paths = []
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: (paths.append(short_conv_backend(a)), short_conv_silu(a, b))[1],
                             backend="aot_eager", fullgraph=True)
    y, _ = compiled(x.detach(), w.detach())
    torch.testing.assert_close(y, short_conv_silu_torch(x.detach(), w.detach(), None)[0], rtol=1e-5, atol=1e-6)
    assert paths == ["taps"]
