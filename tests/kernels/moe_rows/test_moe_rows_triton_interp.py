"""The MoE row ops in Triton (kernels/moe_rows/triton.py) on the CPU under TRITON_INTERPRET=1: the
dispatch (a gather; its backward each token's K row gradients summed) and the combine (each token's K
rows weighted by p and summed; its backward dy and dp) against LatentMoE's index_select / index_add
formula in float64 (moe_rows_references.py), at M = 37 tokens (a ragged last block), K = 1, 4 and 6,
L = 48, fp32 and bf16, with whole rows and with the loop over 16-wide chunks; the ops inside
torch.compile(fullgraph=True) (aot_eager); the checks.

The kernel cases run in one fresh interpreter process, this file run as a script (`triton.jit` picks
interpreter or compiler when the kernels are imported); each prints one JSON line of relative RMS
errors ‖a − b‖ / ‖b‖. Every buffer the ops allocate starts NaN-poisoned, so an element a kernel
forgets to write shows up.
    TRITON_INTERPRET=1 PYTHONPATH=. python tests/kernels/moe_rows/test_moe_rows_triton_interp.py [case ...]
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.kernels.interp_script import run_cases, script_results

NAMES = ["z_R", "dz", "u", "dy", "dp"]
# Module constants of kernels/moe_rows/triton.py per case; "chunked": 16-wide chunks of L = 48 (3 a
# row), 4 tokens a program (10 programs over 37 tokens, the last of one token).
TILES = {"default": {}, "chunked": {"ROW_TILE": 64, "MAX_BLOCK_L": 16}}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# ---- the subprocess: cases under the interpreter ----------------------------------------------------


def _run_ops(t: dict, ops) -> dict:
    dispatch_rows, combine_rows = ops
    z = t["z"].clone().requires_grad_(True)
    z_R = dispatch_rows(z, t["token_R"], t["inv_MK"])
    z_R.backward(t["dz_R"])
    y = t["y"].clone().requires_grad_(True)
    p = t["p"].clone().requires_grad_(True)
    u = combine_rows(y, p, t["inv_MK"], t["z"].dtype)
    u.backward(t["du"])
    return dict(z_R=z_R.detach(), dz=z.grad, u=u.detach(), dy=y.grad, dp=p.grad)


def _compare(M: int, K: int, dtype: torch.dtype, tiles: str, seed: int) -> dict:
    import kernels.moe_rows.triton as kt
    from moe_rows_references import make_inputs, reference, rel

    defaults = {name: getattr(kt, name) for name in TILES[tiles]}
    for name, value in TILES[tiles].items():
        setattr(kt, name, value)
    try:
        t = make_inputs(M, K, 48, dtype, seed)
        got = _run_ops(t, (kt.dispatch_rows, kt.combine_rows))
    finally:
        for name, value in defaults.items():
            setattr(kt, name, value)
    want = reference(t)
    out = {n: rel(got[n], want[n]) for n in NAMES}
    out["z_R_exact"] = bool(torch.equal(got["z_R"], t["z"].index_select(0, t["token_R"])))
    out["finite"] = all(bool(torch.isfinite(v).all()) for v in got.values())
    out["dtypes_kept"] = all(got[n].dtype == dtype for n in ("z_R", "dz", "u", "dy")) and got["dp"].dtype == torch.float32
    return out


def _compiled_vs_eager(dynamic: bool) -> dict:
    """Both ops in one torch.compile(fullgraph=True) function (a graph break raises) give the eager ops'
    outputs and gradients: the same kernels on the same numbers."""
    import kernels.moe_rows.triton as kt
    from moe_rows_references import make_inputs

    t = make_inputs(37, 4, 48, torch.float32, seed=9)

    def both(z, y, p):
        z_R = kt.dispatch_rows(z, t["token_R"], t["inv_MK"])
        return z_R, kt.combine_rows(y, p, t["inv_MK"], z.dtype)

    torch._dynamo.reset()
    compiled = torch.compile(both, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    results = []
    for fn in (both, compiled):
        z, y, p = (t[n].clone().requires_grad_(True) for n in ("z", "y", "p"))
        z_R, u = fn(z, y, p)
        (z_R * t["dz_R"]).sum().add((u * t["du"]).sum()).backward()
        results.append([z_R.detach(), u.detach(), z.grad, y.grad, p.grad])
    return {n: (a - b).abs().max().item() for n, a, b in zip(["z_R", "u", "dz", "dy", "dp"], *results)}


def _cases() -> dict:
    cases = {}
    for dname, dtype in DTYPES.items():
        for tiles in TILES:
            for K in (1, 4, 6):
                cases[f"k{K}_{dname}_{tiles}"] = (lambda K=K, dtype=dtype, tiles=tiles:
                                                  _compare(37, K, dtype, tiles, seed=K))
    cases["compiled_static"] = lambda: _compiled_vs_eager(dynamic=False)
    cases["compiled_dynamic"] = lambda: _compiled_vs_eager(dynamic=True)
    return cases


# ---- the tests --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results():
    return script_results(__file__)


@pytest.mark.parametrize("K", [1, 4, 6])
@pytest.mark.parametrize("tiles", list(TILES))
def test_fp32_rows_match_the_index_formula(results, K, tiles):
    r = results[f"k{K}_fp32_{tiles}"]
    assert r["finite"] and r["dtypes_kept"] and r["z_R_exact"], r
    for name in NAMES:
        assert r[name] <= 1e-6, (name, r)


@pytest.mark.parametrize("K", [1, 4, 6])
@pytest.mark.parametrize("tiles", list(TILES))
def test_bf16_rows_match_the_index_formula_to_bf16_rounding(results, K, tiles):
    # dz, u and dy are stored in bf16 (2⁻⁹ relative rounding, once: the sums run in fp32); dp is an
    # fp32 sum of products of bf16 numbers, exact in fp32 but for the sum's order.
    r = results[f"k{K}_bf16_{tiles}"]
    assert r["finite"] and r["dtypes_kept"] and r["z_R_exact"], r
    for name in ("dz", "u", "dy"):
        assert r[name] <= 5e-3, (name, r)
    assert r["dp"] <= 1e-6, r


@pytest.mark.parametrize("case", ["compiled_static", "compiled_dynamic"])
def test_the_ops_compile_without_a_graph_break_and_give_the_eager_numbers(results, case):
    r = results[case]
    assert all(v == 0.0 for v in r.values() if isinstance(v, float)), r


def test_bad_inputs_raise_value_errors_that_say_what_to_change(monkeypatch):
    pytest.importorskip("triton")
    from kernels.moe_rows.triton import combine_rows, dispatch_rows

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    z, inv = torch.randn(3, 8), torch.arange(6).view(3, 2)
    with pytest.raises(ValueError, match=r"R = M·K rows"):
        dispatch_rows(z, torch.zeros(5, dtype=torch.long), inv)
    with pytest.raises(ValueError, match="integer permutation"):
        dispatch_rows(z, torch.zeros(6, dtype=torch.long), inv.float())
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        combine_rows(torch.randn(6, 8, dtype=torch.float64), torch.rand(3, 2), inv, torch.float32)
    with pytest.raises(ValueError, match=r"p, inv both \[M, K\]"):
        combine_rows(torch.randn(6, 8), torch.rand(2, 3), inv, torch.float32)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        combine_rows(torch.randn(6, 8), torch.rand(3, 2), inv, torch.float32)


if __name__ == "__main__":
    run_cases(_cases(), sys.argv[1:])
