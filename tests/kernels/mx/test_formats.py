"""Element and scale codes against the OCP MX v1.0 / OCP FP8 definitions."""

import math

import pytest
import torch

from kernels.mx import naive

# OCP MX v1.0 Table: FP4 E2M1 (bias 1) — every code, written out.
SPEC_FP4 = {
    0b0000: 0.0, 0b0001: 0.5, 0b0010: 1.0, 0b0011: 1.5, 0b0100: 2.0, 0b0101: 3.0, 0b0110: 4.0, 0b0111: 6.0,
    0b1000: -0.0, 0b1001: -0.5, 0b1010: -1.0, 0b1011: -1.5, 0b1100: -2.0, 0b1101: -3.0, 0b1110: -4.0, 0b1111: -6.0,
}


def test_all_16_fp4_codes_decode_to_the_spec_values():
    got = naive.decode_elements(torch.arange(16, dtype=torch.uint8), "fp4_e2m1")
    for code, value in SPEC_FP4.items():
        assert got[code].item() == value
        assert math.copysign(1.0, got[code].item()) == math.copysign(1.0, value)


def test_all_256_fp8_codes_decode_to_the_spec_values():
    got = naive.decode_elements(torch.arange(256, dtype=torch.uint8), "fp8_e4m3")
    # An independent decoder: torch's float8_e4m3fn implements the same OCP E4M3 encoding.
    ref = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    assert torch.equal(got.nan_to_num(0.0), ref.nan_to_num(0.0))
    finite = ~torch.isnan(ref)
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(ref[finite]))  # -0.0 at 0x80
    # Spot values from the spec's table.
    assert got[0x7E].item() == 448.0 and got[0xFE].item() == -448.0          # max normal S.1111.110
    assert math.isnan(got[0x7F].item()) and math.isnan(got[0xFF].item())     # NaN S.1111.111 only
    assert got[0x08].item() == 2.0**-6 and got[0x01].item() == 2.0**-9       # min normal, min subnormal
    assert got[0x07].item() == 0.875 * 2.0**-6                                 # max subnormal
    assert got[0x38].item() == 1.0
    assert torch.isfinite(got).sum().item() == 254                             # no Inf anywhere


def test_e8m0_scale_codes():
    got = naive.decode_e8m0(torch.arange(256, dtype=torch.uint8))
    assert got[127].item() == 1.0 and got[0].item() == 2.0**-127 and got[254].item() == 2.0**127
    assert math.isnan(got[255].item())
    assert torch.equal(got[:255], torch.tensor([2.0 ** (e - 127) for e in range(255)], dtype=torch.float64))


@pytest.mark.parametrize("fmt", ["fp4_e2m1", "fp8_e4m3"])
def test_encode_is_nearest_with_ties_to_even_and_saturates(fmt):
    table = naive.element_table(fmt)
    half = table.numel() // 2
    mags = table[:half]
    mags = mags[~torch.isnan(mags)]
    # Every representable value encodes to itself, both signs.
    codes = naive.encode_elements(torch.cat([mags, -mags]), fmt)
    assert torch.equal(naive.decode_elements(codes, fmt), torch.cat([mags, -mags]))
    # Midpoints between neighbours go to the even code; just off the midpoint goes to the nearer.
    lo, hi = mags[:-1], mags[1:]
    mid = (lo + hi) / 2
    got = naive.decode_elements(naive.encode_elements(mid, fmt), fmt)
    lo_code = torch.arange(len(lo))
    want = torch.where(lo_code % 2 == 0, lo, hi)
    assert torch.equal(got, want)
    eps = (hi - lo) * 1e-3
    assert torch.equal(naive.decode_elements(naive.encode_elements(mid - eps, fmt), fmt), lo)
    assert torch.equal(naive.decode_elements(naive.encode_elements(mid + eps, fmt), fmt), hi)
    # Saturation: anything beyond max normal encodes to +-max normal.
    top = mags.max().item()
    big = torch.tensor([top * 1.01, top * 1e6, -top * 3], dtype=torch.float64)
    assert naive.decode_elements(naive.encode_elements(big, fmt), fmt).tolist() == [top, top, -top]


def test_fp4_ties_on_a_worked_example():
    y = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0], dtype=torch.float64)
    got = naive.decode_elements(naive.encode_elements(y, "fp4_e2m1"), "fp4_e2m1").tolist()
    assert got == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -4.0]


def test_scale_rounding_floor_clips_and_ceil_does_not():
    x = torch.zeros(32, dtype=torch.float64)
    x[0] = 7.0  # floor: X = 2^(2 - 2) = 1, 7 -> 6 (clipped); ceil: X = 2, 3.5 -> 4 (tie to even) -> 8
    x[1] = 1.0
    c, s = naive.quantize(x, "fp4_e2m1", scale_rounding="floor")
    assert s.item() == 127 and naive.dequantize(c, s, "fp4_e2m1", 32, 32)[0].item() == 6.0
    c, s = naive.quantize(x, "fp4_e2m1", scale_rounding="ceil")
    assert s.item() == 128 and naive.dequantize(c, s, "fp4_e2m1", 32, 32)[0].item() == 8.0
    # When the maximum is representable both rules agree: 6 * 2^k with ceil, 4 * 2^k with floor.
    for amax in (6.0, 4.0, 3.0):
        x[0] = amax
        assert torch.equal(naive.quantize(x, "fp4_e2m1", scale_rounding="floor")[1],
                           naive.quantize(x, "fp4_e2m1", scale_rounding="ceil")[1])
