"""GemvConfig(reduce="in_kernel") compiled for sm_90 on the CPU: the PTX has the order its memory
model argument rests on (kernels/mx/triton_matmul.py, _gemv_epilogue): every partial store, then a
CTA barrier, then one acq_rel atomic at GPU scope, then a barrier (the broadcast of its result)
before the last program's partial loads, which read through L2 (.cg). Whether the reduction is also
fast is for benchmarks/mx_variants.py on the H200."""

import pytest

pytest.importorskip("triton")

from tests.kernels.mx.sass_report import NO_TOOLS, TOOLS, sass_report  # noqa: E402


@pytest.mark.skipif(not TOOLS, reason=NO_TOOLS)
def test_in_kernel_reduce_orders_partials_before_the_counter():
    report = sass_report("ordering")
    for acc in ("f32", "f16x2"):
        r = report[acc]
        assert r["atomics"] == ["global.gpu.acq_rel.add.u32"], r
        assert r["partial_stores_before_atomic"] >= 2 and r["bar_sync_between_stores_and_atomic"], r
        assert r["bar_sync_between_atomic_and_loads"], r
        # Two halves of the tile per split, all through L2.
        assert r["partial_loads"] == 2 * r["splits"] == r["partial_loads_cg"], r
