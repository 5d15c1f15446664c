"""mx_linear on the CPU (the torch_dequant path) and its input checks; the Triton paths are in
test_triton_interpret.py and, on the H200, in benchmarks/kernels/mx.py."""

import pytest
import torch

from kernels.mx import matmul_path, mx_linear, naive, quantize_mx


@pytest.fixture(autouse=True)
def cpu_path(monkeypatch):
    """These tests are about the CPU path: TRITON_INTERPRET=1 in the caller's shell would route
    mx_linear to the Triton kernels instead (the dispatcher reads it at call time)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _weight(n=48, k=96, seed=0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return quantize_mx(w, "fp4_e2m1")


@pytest.mark.parametrize("act_fmt", [None, "fp8_e4m3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_path_matches_the_reference(act_fmt, dtype):
    wq = _weight(k=80)  # K padded to 96 in storage
    x = torch.randn(2, 5, 80).to(dtype)
    bias = torch.randn(48)
    assert matmul_path(x, wq) == "torch_dequant"
    with torch.no_grad():
        y = mx_linear(x, wq, bias, act_fmt=act_fmt)
    ref = naive.mx_linear(x.reshape(10, 80), wq.element_codes(), wq.scales, 80, act_fmt=act_fmt, bias=bias)
    assert y.shape == (2, 5, 48) and y.dtype == dtype
    err = ((y.reshape(10, 48).double() - ref).norm() / ref.norm()).item()
    assert err < (1e-6 if dtype == torch.float32 else 1e-2)


def test_mxfp8_activations_change_the_result():
    wq = _weight()
    x = torch.randn(4, 96)
    with torch.no_grad():
        assert not torch.equal(mx_linear(x, wq), mx_linear(x, wq, act_fmt="fp8_e4m3"))


@pytest.mark.parametrize("case, match", [
    ("fp8_weight", "MXFP4"), ("wrong_k", "last dimension"), ("act_fp4", "act_fmt"),
    ("bias_shape", "bias"), ("needs_grad", "no_grad"), ("forced_triton", "TRITON_INTERPRET"),
    ("bad_path", "path"), ("int_x", "takes x"),
])
def test_bad_input_raises_a_value_error(case, match):
    wq = _weight()
    x = torch.randn(3, 96)
    kwargs = {}
    if case == "fp8_weight":
        wq = quantize_mx(torch.randn(48, 96), "fp8_e4m3")
    elif case == "wrong_k":
        x = torch.randn(3, 64)
    elif case == "act_fp4":
        kwargs["act_fmt"] = "fp4_e2m1"
    elif case == "bias_shape":
        kwargs["bias"] = torch.randn(47)
    elif case == "needs_grad":
        x.requires_grad_(True)
    elif case == "forced_triton":
        kwargs["path"] = "triton_gemv"
    elif case == "bad_path":
        kwargs["path"] = "cutlass"
    elif case == "int_x":
        x = torch.ones(3, 96, dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        mx_linear(x, wq, **kwargs)


def test_experts_torch_path_equals_mx_linear_per_row():
    """mx_linear_experts on the CPU: row j through expert ids[j] of a stack, as mx_linear on that
    expert alone (repeated and unused experts, K padded in storage, a stride-0 x)."""
    from kernels.mx import mx_linear_experts

    stack = quantize_mx(torch.randn(5, 24, 80, generator=torch.Generator().manual_seed(3)), "fp4_e2m1")
    one = [quantize_mx(w, "fp4_e2m1") for w in torch.randn(5, 24, 80, generator=torch.Generator().manual_seed(3))]
    ids = torch.tensor([4, 1, 4, 0])
    for x in (torch.randn(4, 80), torch.randn(1, 80).expand(4, 80)):
        with torch.no_grad():
            y = mx_linear_experts(x, stack, ids)
            want = torch.cat([mx_linear(x[j:j + 1], one[e]) for j, e in enumerate(ids.tolist())])
        assert y.shape == (4, 24) and torch.allclose(y, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case, match", [
    ("two_d", "stack"), ("bad_id", r"\[0, 5\)"), ("float_ids", "integer"), ("short_ids", "integer"),
    ("wrong_k", "x must be"), ("bad_path", "path"), ("forced_triton", "TRITON_INTERPRET"),
])
def test_experts_bad_input_raises_a_value_error(case, match):
    from kernels.mx import mx_linear_experts

    stack = quantize_mx(torch.randn(5, 24, 96), "fp4_e2m1")
    x, ids, kwargs = torch.randn(3, 96), torch.tensor([0, 1, 2]), {}
    if case == "two_d":
        stack = _weight()
    elif case == "bad_id":
        ids = torch.tensor([0, 5, 1])
    elif case == "float_ids":
        ids = ids.float()
    elif case == "short_ids":
        ids = ids[:2]
    elif case == "wrong_k":
        x = torch.randn(3, 64)
    elif case in ("bad_path", "forced_triton"):
        kwargs["path"] = "nope" if case == "bad_path" else "triton_gemv_grouped"
    with torch.no_grad(), pytest.raises(ValueError, match=match):
        mx_linear_experts(x, stack, ids, **kwargs)
