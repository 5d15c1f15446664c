"""The GEMV kernel compiled for sm_90 on the CPU (its inline PTX passes ptxas): at default_gemv_config's
two tiles its K loop has no barrier, no shared-memory instruction and no spill, and is made of packed
fp16 FMAs. Read from the SASS of the Triton wheel's ptxas/cuobjdump (sass_checks.py); timing is
benchmarks/kernels/mx.py's, on the GPU."""

import pytest

pytest.importorskip("triton")

from tests.kernels.mx.sass_report import NO_TOOLS, TOOLS, sass_report  # noqa: E402


@pytest.mark.skipif(not TOOLS, reason=NO_TOOLS)
def test_default_gemv_loop_is_packed_and_exchange_free():
    """At least one packed FMA per two weight values (the products are really packed), and at most 4.2
    instructions per weight value (sm_90 SASS counts in docs/log/mx.md: 3.5 and 3.1; the f32 kernel
    that came before had 5.9)."""
    report = sass_report("default")
    assert len(report) == 2, report
    for key, r in report.items():
        assert r["bar"] == 0 and r["shared"] == 0, (key, r)
        assert r["local_memory_instructions"] == 0 and r["stack_bytes"] == 0, (key, r)
        assert r["hfma2"] >= r["values_per_thread"] // 2, (key, r)
        assert r["per_value"] <= 4.2, (key, r)
