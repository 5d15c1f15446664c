"""The MX element formats and scale-rounding rules (OCP Microscaling Formats v1.0).

An MX block is k = 32 consecutive values that share one E8M0 scale X = 2^(E - 127); each value
is stored as an element P_i of a small float format, and decodes as v_i = X * P_i.

    format     bits  exp bias  emax  max normal  min subnormal  specials
    fp4_e2m1      4         1     2         6.0          0.5      none (no Inf, no NaN)
    fp8_e4m3      8         7     8       448.0         2^-9      NaN only (S.1111.111)
    E8M0 scale    8       127   127       2^127        (2^-127)   0xFF = NaN; no zero, no sign

Scale rounding (the exponent s of X = 2^s for a block with largest magnitude amax):
- "floor" (OCP §6.3): s = floor(log2 amax) - emax. amax / X lies in [2^emax, 2^(emax+1)), above the
  element's max normal whenever the block maximum's mantissa is large (fp4: 7 -> 6), so block
  maxima clip; research/recipe.md §7(d) records up to 29% error from this.
- "ceil" (the default here; torchao's RCEIL, what cuBLAS/NVIDIA use): the smallest s with
  amax <= max_normal * 2^s, i.e. s = ceil(log2(amax / max_normal)). Nothing clips; it differs from
  floor only for blocks whose maximum would have clipped.
Both clamp s to the E8M0 range [-127, 127]; a block holding NaN or +-Inf gets the NaN scale 0xFF
(so the whole block decodes to NaN: neither element format nor E8M0 can carry an Inf).
"""

from __future__ import annotations

from dataclasses import dataclass

SCALE_ROUNDINGS = ("ceil", "floor")
E8M0_BIAS = 127
E8M0_NAN = 0xFF
SCALE_EXP_MIN = -127
SCALE_EXP_MAX = 127


@dataclass(frozen=True)
class MXFormat:
    name: str
    ebits: int
    mbits: int
    bias: int
    max_normal: float
    # The fp32 mantissa field of max_normal / 2^emax: a block maximum whose own mantissa field
    # exceeds this needs s one above floor under the "ceil" rule (fp4: 6 = 4 * 1.5, fp8: 448 = 256 * 1.75).
    max_mantissa_fp32: int

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def emax(self) -> int:
        # The largest normal exponent; E4M3 uses the top exponent field for normals (only
        # mantissa 111 there is NaN), so its emax is 15 - 7 = 8.
        return (1 << self.ebits) - 1 - self.bias

    @property
    def emin(self) -> int:
        return 1 - self.bias


FP4_E2M1 = MXFormat("fp4_e2m1", ebits=2, mbits=1, bias=1, max_normal=6.0, max_mantissa_fp32=0x400000)
FP8_E4M3 = MXFormat("fp8_e4m3", ebits=4, mbits=3, bias=7, max_normal=448.0, max_mantissa_fp32=0x600000)
FORMATS = {f.name: f for f in (FP4_E2M1, FP8_E4M3)}


def get_format(fmt: str) -> MXFormat:
    if fmt not in FORMATS:
        raise ValueError(f"unknown MX element format {fmt!r}: use one of {sorted(FORMATS)}")
    return FORMATS[fmt]


def check_scale_rounding(scale_rounding: str) -> None:
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding={scale_rounding!r}: use one of {SCALE_ROUNDINGS}")
