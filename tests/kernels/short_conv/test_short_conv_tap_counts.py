"""kernels.short_conv beyond Kimi's 4 taps: the C kernel's general tap count (2, 3, 7) against conv1d
on outputs and both gradients, a last 8-channel block beside 16-channel ones, and a window wider
than the kernel's register sums going to the torch path."""

import pytest
import torch

from kernels.short_conv import cpu, short_conv_backend, short_conv_silu, short_conv_silu_torch

needs_kernel = pytest.mark.skipif(cpu.load() is None, reason=f"C kernel not built: {cpu.load_error()}")


@needs_kernel
@pytest.mark.parametrize("W, C, with_state", [(2, 24, True), (3, 40, False), (7, 16, True)])
def test_other_tap_counts_match_conv1d(W, C, with_state):
    torch.manual_seed(W)
    x = torch.randn(2, 19, C, requires_grad=True)
    w = (torch.randn(C, 1, W) * 0.5).requires_grad_()
    state = torch.randn(2, C, W - 1) if with_state else None
    dy = torch.randn(2, 19, C)
    results = []
    for fn in (cpu.short_conv_silu_cpu, short_conv_silu_torch):
        x.grad = w.grad = None
        y, new_state = fn(x, w, state)
        y.backward(dy)
        results.append((y.detach(), new_state, x.grad, w.grad))
    for got, ref in zip(*results):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


def test_more_taps_than_the_kernel_holds_take_the_torch_path():
    torch.manual_seed(0)
    x, w = torch.randn(2, 30, 16), torch.randn(16, 1, cpu.MAX_TAPS + 1)
    assert short_conv_backend(x, taps=cpu.MAX_TAPS + 1) == "torch"
    y, state = short_conv_silu(x, w)
    ref_y, ref_state = short_conv_silu_torch(x, w, None)
    assert torch.equal(y, ref_y) and torch.equal(state, ref_state)
