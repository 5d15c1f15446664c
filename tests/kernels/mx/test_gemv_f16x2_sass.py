"""The accumulate="f16x2" GEMV compiles for sm_90 (its inline PTX passes ptxas) and its K loop is made
of packed fp16 FMAs rather than one FFMA per weight value; checked on the CPU from the SASS that the
Triton wheel's ptxas and cuobjdump produce (sass_checks.py). Timing is benchmarks/mx_variants.py's."""

import pytest

pytest.importorskip("triton")

from tests.kernels.mx.sass_report import NO_TOOLS, TOOLS, sass_report  # noqa: E402


@pytest.mark.skipif(not TOOLS, reason=NO_TOOLS)
def test_f16x2_gemv_compiles_for_sm90_with_packed_fmas():
    report = sass_report()
    for block_n in (32, 64):
        f16, f32 = report[f"f16x2/block_n={block_n}"], report[f"f32/block_n={block_n}"]
        # One packed FMA per two weight values, and no per-value FFMA left.
        assert f16["hfma2"] >= f16["values_per_thread"] // 2, f16
        assert f16["ffma"] <= f16["values_per_thread"] // 16, f16
        assert f32["ffma"] >= f32["values_per_thread"], f32
        assert f16["per_value"] < f32["per_value"], (f16, f32)
