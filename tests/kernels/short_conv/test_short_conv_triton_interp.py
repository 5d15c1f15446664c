"""The Triton short conv + SiLU (+ per-head L2 norm) against the torch reference, on the CPU under
TRITON_INTERPRET=1.

`triton.jit` picks interpreter or compiler when the kernels are imported, so the cases run in one
fresh process: this file run as a script (`TRITON_INTERPRET=1 PYTHONPATH=. python <this file> [case ...]`) prints
one JSON line of metrics per case, and each test checks one case's. The reference
(`short_conv_references.py`) is naive.py's tap sum followed by the torch L2 formula, in float64 with
autograd; bf16 inputs are
compared against it on the same bf16-rounded inputs. Every buffer the kernels allocate starts
NaN-poisoned, so an element a kernel forgets to write shows up.
"""

from __future__ import annotations

import sys

import pytest
import torch
from short_conv_references import outputs_and_grads, reference, rel

from tests.kernels.interp_script import run_cases, script_results
OUTS = ["y", "dx", "dw"]


def compare(B, T, C, W, head_dim, seed, dtype=torch.float32, w_dtype=torch.float32, x=None):
    from kernels.short_conv.triton import short_conv_silu_triton

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=gen) if x is None else x
    w = torch.randn(C, 1, W, generator=gen) * 0.5
    dy = torch.randn(B, T, C, generator=gen)
    x, w, dy = x.to(dtype), w.to(w_dtype), dy.to(dtype)
    got = outputs_and_grads(lambda a, b: short_conv_silu_triton(a, b, head_dim), x, w, dy)
    ref = outputs_and_grads(lambda a, b: reference(a, b, head_dim), x.double(), w.double(), dy.double())
    out = {n: rel(g, r) for n, g, r in zip(OUTS, got, ref)}
    out["finite"] = all(bool(torch.isfinite(g).all()) for g in got)
    out["dtypes"] = [str(g.dtype) for g in got]
    return out


def case_fp32_heads():
    return compare(2, 37, 32, 4, head_dim=16, seed=0)


def case_fp32_plain():
    # 24 channels: one 32-wide tile with masked lanes; 3 taps.
    return compare(3, 70, 24, 3, head_dim=0, seed=1)


def case_shorter_than_taps_heads():
    return compare(2, 2, 32, 4, head_dim=16, seed=2)


def case_shorter_than_taps_plain():
    return compare(3, 1, 16, 4, head_dim=0, seed=3)


def case_bf16_heads():
    return compare(2, 37, 32, 4, head_dim=16, seed=4, dtype=torch.bfloat16)


def case_bf16_plain_bf16_weight():
    return compare(2, 37, 32, 4, head_dim=0, seed=5, dtype=torch.bfloat16, w_dtype=torch.bfloat16)


def case_tiny_heads():
    """Rows whose head is tiny, Σu² < eps²: there the norm's clamp holds, and its backward is dy / eps
    without the projection."""
    x = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(6))
    x[:, 5:12, :16] *= 1e-7
    return compare(2, 20, 32, 4, head_dim=16, seed=7, x=x)


def case_several_tiles():
    """Many row tiles, the last one past the rows' end; sequences straddling tiles (dx's shifted dp and
    dw's shifted x across a tile edge); non-power-of-two head width (24)."""
    from kernels.short_conv import triton as triton_conv

    rows = triton_conv.BWD_ROWS
    triton_conv.BWD_ROWS = 16
    try:
        return compare(2, 150, 48, 4, head_dim=24, seed=8)
    finally:
        triton_conv.BWD_ROWS = rows


def case_non_contiguous_input():
    from kernels.short_conv.triton import short_conv_silu_triton

    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 32, 19, generator=gen).transpose(1, 2)  # [B, T, C] = [2, 19, 32], strided
    w = torch.randn(32, 1, 4, generator=gen)
    return {"y": rel(short_conv_silu_triton(x, w, 16), reference(x.double(), w.double(), 16))}


def case_compiled():
    """The custom op inside a torch.compile region (fullgraph: no graph break), forward and backward,
    against eager."""
    from kernels.short_conv.triton import short_conv_silu_triton

    gen = torch.Generator().manual_seed(10)
    x, g = torch.randn(2, 9, 32, generator=gen), torch.randn(2, 9, 32, generator=gen)
    w = torch.randn(32, 1, 4, generator=gen)

    def loss(a, b):
        return (short_conv_silu_triton(a * 2.0, b, 16) * g).sum()

    results = []
    for fn in (loss, torch.compile(loss, backend="aot_eager", fullgraph=True)):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        value = fn(a, b)
        value.backward()
        results.append((value.detach(), a.grad, b.grad))
    return {n: (e - c).abs().max().item() for n, e, c in zip(["loss", "dx", "dw"], *results)}


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


@pytest.fixture(scope="module")
def results():
    return script_results(__file__)


@pytest.mark.parametrize("case", ["fp32_heads", "fp32_plain", "shorter_than_taps_heads", "shorter_than_taps_plain",
                                  "tiny_heads", "several_tiles"])
def test_fp32_outputs_and_both_gradients(results, case):
    r = results[case]
    assert r["finite"] and r["dtypes"] == ["torch.float32"] * 3, r
    for name in OUTS:
        assert r[name] <= 1e-5, (name, r)


@pytest.mark.parametrize("case, dtypes", [("bf16_heads", ["torch.bfloat16", "torch.bfloat16", "torch.float32"]),
                                          ("bf16_plain_bf16_weight", ["torch.bfloat16"] * 3)])
def test_bf16_inputs_against_fp64_on_the_rounded_inputs(results, case, dtypes):
    r = results[case]
    assert r["finite"] and r["dtypes"] == dtypes, r
    for name in OUTS:
        assert r[name] <= 1e-2, (name, r)


def test_non_contiguous_input(results):
    assert results["non_contiguous_input"]["y"] <= 1e-5


def test_inside_torch_compile_without_graph_break(results):
    r = results["compiled"]
    assert r["loss"] <= 1e-4 and r["dx"] == 0.0 and r["dw"] == 0.0, r


def test_bad_shapes_say_what_to_change():
    triton_conv = pytest.importorskip("kernels.short_conv.triton")
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match="1 to 8 taps"):
        triton_conv.short_conv_silu_triton(x, torch.randn(32, 1, 9))
    with pytest.raises(ValueError, match="divide C = 32"):
        triton_conv.short_conv_silu_triton(x, torch.randn(32, 1, 4), head_dim=12)
    with pytest.raises(ValueError, match=r"\[C, 1, W\]"):
        triton_conv.short_conv_silu_triton(x, torch.randn(16, 1, 4))
    with pytest.raises(ValueError, match=r"\[B, T, C\]"):
        triton_conv.short_conv_silu_triton(x[0], torch.randn(32, 1, 4))


def test_cpu_tensors_keep_their_paths_and_the_l2_form_falls_back_to_torch():
    """On the CPU the fused form is the existing conv path followed by the torch L2 formula."""
    from kernels.short_conv import short_conv_backend, short_conv_silu, short_conv_silu_l2

    torch.manual_seed(11)
    x, w = torch.randn(2, 13, 32), torch.randn(32, 1, 4)
    assert short_conv_backend(x) in ("c", "torch")
    y, _ = short_conv_silu(x, w)
    y_BTHK = y.view(2, 13, 2, 16)
    expected = (y_BTHK * torch.rsqrt((y_BTHK * y_BTHK).sum(-1, keepdim=True).clamp_min(1e-12))).view(2, 13, 32)
    assert torch.equal(short_conv_silu_l2(x, w, 16), expected)
    with pytest.raises(ValueError, match="divide the channels"):
        short_conv_silu_l2(x, w, 12)


if __name__ == "__main__":
    run_cases(CASES, sys.argv[1:])
