"""The torch fast path (kernels/mx/quant.py) against the float64 reference (kernels/mx/naive.py)."""

import pytest
import torch

from kernels.mx import dequantize, fake_quant_mx, naive, pack_fp4, quantize_mx, unpack_fp4
from kernels.mx.quant import fake_quant_torch

FMTS = ["fp4_e2m1", "fp8_e4m3"]


def _special_blocks(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows over many magnitudes, with blocks of NaN, Inf, zeros, subnormals, huge and tiny values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-20, 20, (rows, 1), generator=g).float())
    big = torch.finfo(dtype).max
    tiny = torch.finfo(dtype).tiny
    x[0, 3] = float("nan")
    x[1, 40 % k] = float("inf")
    x[2, 7] = -float("inf")
    x[3, :32] = 0.0
    x[4, :32] = tiny * torch.rand(32, generator=g)                  # subnormals of dtype
    x[5, :32] = big * (torch.rand(32, generator=g) * 2 - 1)        # near the dtype's max
    x[6, :32] = torch.tensor([1e-30] * 31 + [1e30])                # one huge value swamps the block
    x[7, :32] = -0.0
    x[8, :32] = torch.tensor([6.0, 7.0, 448.0, 500.0] * 8)         # clip candidates for both formats
    return x.to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values with NaN == NaN and the sign of zero respected."""
    both_nan = torch.isnan(a) & torch.isnan(b)
    eq = (a == b) & (torch.signbit(a) == torch.signbit(b))
    return bool((both_nan | eq).all())


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("scale_rounding", ["ceil", "floor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [63, 1000])
def test_codes_and_values_match_the_reference(fmt, scale_rounding, dtype, k):
    x = _special_blocks(24, k, dtype, seed=k)
    t = quantize_mx(x, fmt, scale_rounding=scale_rounding)
    codes, scales = naive.quantize(x, fmt, scale_rounding=scale_rounding)
    assert torch.equal(t.element_codes(), codes)
    assert torch.equal(t.scales, scales)
    got = t.dequantize(torch.float32)
    ref = naive.dequantize(codes, scales, fmt, 32, k).float()  # 2^128 (exact in float64) is inf in float32
    assert got.shape == x.shape and _same(got, ref)
    assert _same(fake_quant_torch(x, fmt, scale_rounding=scale_rounding).float(),
                 naive.fake_quant(x, fmt, scale_rounding=scale_rounding).float())


@pytest.mark.parametrize("fmt", FMTS)
def test_nan_and_inf_blocks_decode_to_nan_and_only_those(fmt):
    x = _special_blocks(24, 96, torch.float32, seed=1)
    t = quantize_mx(x, fmt)
    dq = t.dequantize()
    nan_block = ~torch.isfinite(x.reshape(24, 3, 32)).all(-1)
    assert torch.equal(t.scales == 0xFF, nan_block)
    assert torch.isnan(dq.reshape(24, 3, 32)[nan_block]).all()
    # Other blocks never decode to NaN (a block near float32's max may round up to 2^128 = inf).
    assert not torch.isnan(dq.reshape(24, 3, 32)[~nan_block]).any()


def test_zero_block_and_error_bounds():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    x[0, :32] = 0
    for fmt, rel in (("fp4_e2m1", 0.25), ("fp8_e4m3", 0.0625)):
        dq = quantize_mx(x, fmt).dequantize()
        assert torch.equal(dq[0, :32], torch.zeros(32))
        # With "ceil" nothing clips: the error is at most half a grid step of the block's top binade.
        amax = x.reshape(64, 8, 32).abs().amax(-1, keepdim=True)
        err = (dq - x).reshape(64, 8, 32).abs()
        assert (err <= rel * amax + 2.0**-126).all()


def test_fp4_packing_order_and_roundtrip():
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x0]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x0F]]  # element 2i in the low nibble
    c = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    assert torch.equal(unpack_fp4(pack_fp4(c)), c)
    t = quantize_mx(torch.randn(3, 64), "fp4_e2m1")
    assert t.codes.shape == (3, 32) and t.scales.shape == (3, 2)
    assert t.nbytes == 3 * 32 + 3 * 2  # 4.25 bits per value


def test_mxtensor_metadata_and_dequantize_dtype():
    x = torch.randn(2, 3, 70, dtype=torch.bfloat16)
    t = quantize_mx(x, "fp8_e4m3")
    assert t.shape == (2, 3, 70) and t.codes.shape == (2, 3, 96) and t.scales.shape == (2, 3, 3)
    assert t.dequantize().dtype == torch.bfloat16 and dequantize(t, torch.float32).dtype == torch.float32
    assert t.dequantize().shape == x.shape


def test_fake_quant_straight_through_gradient():
    x = torch.randn(4, 96, requires_grad=True)
    g = torch.randn(4, 96)
    y = fake_quant_mx(x, "fp4_e2m1")
    y.backward(g)
    assert torch.equal(x.grad, g)
    assert torch.equal(y.detach(), fake_quant_torch(x.detach(), "fp4_e2m1"))
    assert y.dtype == x.dtype and y.shape == x.shape


def test_fake_quant_keeps_x_where_the_result_is_not_finite():
    x = torch.randn(2, 64)
    x[0, 0] = float("inf")
    x[1, 33] = float("nan")
    y = fake_quant_mx(x, "fp8_e4m3")
    assert torch.equal(y[0, :32], x[0, :32])                  # the Inf block passes through
    assert torch.isnan(y[1, 33]) and torch.equal(y[1, 32:33], x[1, 32:33])
    assert torch.equal(y[0, 32:], fake_quant_torch(x[0:1, 32:], "fp8_e4m3")[0])


@pytest.mark.parametrize("bad", [
    dict(fmt="fp6_e3m2"), dict(scale_rounding="nearest"), dict(block_size=33), dict(dtype=torch.float64),
])
def test_bad_input_raises_a_value_error_naming_the_limit(bad):
    x = torch.randn(4, 64, dtype=bad.get("dtype", torch.float32))
    with pytest.raises(ValueError):
        quantize_mx(x, bad.get("fmt", "fp4_e2m1"), block_size=bad.get("block_size", 32),
                    scale_rounding=bad.get("scale_rounding", "ceil"))
