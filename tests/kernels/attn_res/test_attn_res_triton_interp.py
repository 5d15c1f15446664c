"""The Triton AttnRes mix (kernels/attn_res/triton.py) on the CPU under TRITON_INTERPRET=1: h and every
gradient (sources, pseudo-query, key norm weight) against autograd of AttnRes's torch path
(`AttnRes._mix_torch`) on fp32 copies, at N = 2–4 sources of [2, 19, D], D = 48 and 64, fp32, bf16
and mixed fp32/bf16 sources, with whole rows and with the loop over D chunks, the backward's programs
each over several row blocks and the last block ragged; the custom op inside
torch.compile(fullgraph=True) (aot_eager: Dynamo and AOT autograd, no code generation); the checks.

The kernel cases run in one fresh interpreter process, this file run as a script (`triton.jit` picks
interpreter or compiler when the kernels are imported, so the test session cannot have imported them
first); each case prints one JSON line of relative RMS errors ‖a − b‖ / ‖b‖. Every buffer the op
allocates starts NaN-poisoned, so an element a kernel forgets to write shows up.
    TRITON_INTERPRET=1 PYTHONPATH=. python tests/kernels/attn_res/test_attn_res_triton_interp.py [case ...]
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.kernels.interp_script import run_cases, script_results
NAMES = ["h", "dv0", "dv1", "dv2", "dv3", "dquery", "dkey_weight"]

# Module constants of kernels/attn_res/triton.py per case. "small": at D = 48 and 64, 4-row blocks,
# three per backward program (38 rows: 10 blocks, the last of 2 rows; 4 programs, the last of one
# block). "chunked": 16-wide D chunks, so that the two-pass loop runs 3–4 chunks.
TILES = {"default": {}, "small": {"ROW_TILE": 256, "BWD_ROWS_PER_PROGRAM": 12},
         "chunked": {"ROW_TILE": 64, "MAX_BLOCK_D": 16, "BWD_ROWS_PER_PROGRAM": 12}}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# ---- the subprocess: cases under the interpreter ----------------------------------------------------


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _module(D: int, seed: int):
    from k3model.attn_res import AttnRes

    torch.manual_seed(seed)
    module = AttnRes(D)
    with torch.no_grad():  # a nonzero query, so α is not uniform
        module.query.normal_(0.0, 0.5)
        module.key_norm.weight.uniform_(0.5, 1.5)
    return module


def _inputs(N: int, D: int, dtypes: list[torch.dtype], seed: int):
    """Sources of scales 1..N rounded to their dtypes, and dh rounded to the first one's (the dtype of
    h and so of its gradient), so the reference sees exactly the numbers the kernels see."""
    gen = torch.Generator().manual_seed(seed)
    sources = [(torch.randn(2, 19, D, generator=gen) * (1 + i)).to(dtypes[i]) for i in range(N)]
    dh = torch.randn(2, 19, D, generator=gen).to(dtypes[0])
    return sources, dh


def _run(mix, module, sources, dh):
    leaves = [v.clone().requires_grad_(True) for v in sources]
    module.zero_grad(set_to_none=True)
    h = mix(leaves)
    h.backward(dh)
    grads = [v.grad for v in leaves] + [None] * (4 - len(leaves))
    return [h.detach()] + grads + [module.query.grad.clone(), module.key_norm.weight.grad.clone()]


def _compare(N: int, D: int, dtypes: list[torch.dtype], tiles: str, seed: int) -> dict:
    import kernels.attn_res.triton as kt

    defaults = {name: getattr(kt, name) for name in TILES[tiles]}
    for name, value in TILES[tiles].items():
        setattr(kt, name, value)
    try:
        module = _module(D, seed)
        sources, dh = _inputs(N, D, dtypes, seed)

        def triton_mix(xs):
            return kt.attn_res_mix_triton(xs, module.query, module.key_norm.weight, module.key_norm.eps)

        got = _run(triton_mix, module, sources, dh)
        want = _run(module._mix_torch, module, [v.float() for v in sources], dh.float())
    finally:
        for name, value in defaults.items():
            setattr(kt, name, value)
    out = {n: _rel(a, b) for n, a, b in zip(NAMES, got, want) if a is not None}
    out["finite"] = all(bool(torch.isfinite(a).all()) for a in got if a is not None)
    out["dtypes_kept"] = (got[0].dtype == dtypes[0]
                          and all(g.dtype == d for g, d in zip(got[1:1 + N], dtypes)))
    return out


def _compiled_vs_eager(dynamic: bool) -> dict:
    """The op in a torch.compile(fullgraph=True) function (a graph break raises) gives the eager op's h
    and gradients: the same kernels on the same numbers."""
    import kernels.attn_res.triton as kt

    module = _module(64, seed=7)
    sources, dh = _inputs(3, 64, [torch.float32, torch.bfloat16, torch.bfloat16], seed=7)

    def mix(xs):
        return kt.attn_res_mix_triton(xs, module.query, module.key_norm.weight, module.key_norm.eps)

    torch._dynamo.reset()
    compiled = torch.compile(mix, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    eager, comp = _run(mix, module, sources, dh), _run(compiled, module, sources, dh)
    return {n: (a.double() - b.double()).abs().max().item() for n, a, b in zip(NAMES, comp, eager) if a is not None}


def _cases() -> dict:
    cases = {}
    for N in (2, 3, 4):
        for dname, dtype in DTYPES.items():
            for D, tiles in ((48, "small"), (64, "chunked")):
                cases[f"n{N}_d{D}_{dname}_{tiles}"] = (lambda N=N, D=D, dtype=dtype, tiles=tiles:
                                                       _compare(N, D, [dtype] * N, tiles, seed=N + D))
    cases["n3_d64_fp32_default"] = lambda: _compare(3, 64, [torch.float32] * 3, "default", seed=5)
    # The model's mix under bf16 autocast: the fp32 embedding, then bf16 block sums.
    cases["n3_d64_mixed_small"] = lambda: _compare(3, 64, [torch.float32, torch.bfloat16, torch.bfloat16],
                                                   "small", seed=6)
    cases["compiled_static"] = lambda: _compiled_vs_eager(dynamic=False)
    cases["compiled_dynamic"] = lambda: _compiled_vs_eager(dynamic=True)
    return cases


# ---- the tests --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results():
    return script_results(__file__)


@pytest.mark.parametrize("N", [2, 3, 4])
@pytest.mark.parametrize("D, tiles", [(48, "small"), (64, "chunked")])
def test_fp32_sources_match_the_torch_path_on_h_and_every_gradient(results, N, D, tiles):
    r = results[f"n{N}_d{D}_fp32_{tiles}"]
    assert r["finite"] and r["dtypes_kept"], r
    for name in NAMES[:1 + N] + NAMES[-2:]:
        assert r[name] <= 1e-5, (name, r)


@pytest.mark.parametrize("N", [2, 3, 4])
@pytest.mark.parametrize("D, tiles", [(48, "small"), (64, "chunked")])
def test_bf16_sources_match_the_fp32_torch_path_to_bf16_rounding(results, N, D, tiles):
    # h and the sources' gradients are stored in bf16 (2⁻⁹ relative rounding); the query's and key
    # norm's gradients are fp32 sums of the same inputs as the reference's.
    r = results[f"n{N}_d{D}_bf16_{tiles}"]
    assert r["finite"] and r["dtypes_kept"], r
    for name in NAMES[:1 + N]:
        assert r[name] <= 1e-2, (name, r)
    for name in NAMES[-2:]:
        assert r[name] <= 1e-5, (name, r)


def test_default_tiles_and_mixed_dtypes(results):
    r = results["n3_d64_fp32_default"]
    assert r["finite"] and all(r[n] <= 1e-5 for n in ["h", "dv0", "dv1", "dv2", "dquery", "dkey_weight"]), r
    # fp32 embedding + bf16 block sums, as in the model under bf16 autocast: h and dv0 in fp32.
    r = results["n3_d64_mixed_small"]
    assert r["finite"] and r["dtypes_kept"], r
    assert all(r[n] <= 1e-5 for n in ["h", "dv0", "dquery", "dkey_weight"]), r
    assert all(r[n] <= 1e-2 for n in ["dv1", "dv2"]), r


@pytest.mark.parametrize("case", ["compiled_static", "compiled_dynamic"])
def test_the_op_compiles_without_a_graph_break_and_gives_the_eager_numbers(results, case):
    r = results[case]
    assert all(v == 0.0 for v in r.values() if isinstance(v, float)), r


def test_bad_inputs_raise_value_errors_that_say_what_to_change(monkeypatch):
    pytest.importorskip("triton")
    from kernels.attn_res.triton import attn_res_mix_triton

    q, w = torch.zeros(8), torch.ones(8)
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="2 to 4 sources"):
        attn_res_mix_triton([x], q, w, 1e-6)
    with pytest.raises(ValueError, match="2 to 4 sources"):
        attn_res_mix_triton([x] * 5, q, w, 1e-6)
    with pytest.raises(ValueError, match="one shape"):
        attn_res_mix_triton([x, torch.randn(2, 4, 8)], q, w, 1e-6)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        attn_res_mix_triton([x, x.double()], q, w, 1e-6)
    with pytest.raises(ValueError, match=r"shape \[D\]"):
        attn_res_mix_triton([x, x], torch.zeros(4), torch.ones(4), 1e-6)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        attn_res_mix_triton([x, x], q, w, 1e-6)


def test_cpu_sources_keep_the_c_and_torch_paths(monkeypatch):
    """AttnRes on the CPU never reaches the Triton op (CI runs only the CPU): fp32 sources take the C
    kernel when it builds, the rest (bf16 here) the torch code."""
    from k3model.attn_res import AttnRes

    def fail(*args, **kwargs):
        raise AssertionError("the Triton op was called on CPU sources")

    monkeypatch.setattr("k3model.attn_res.attn_res_mix_triton", fail, raising=True)
    module = AttnRes(16)
    for dtype in (torch.float32, torch.bfloat16):
        sources = [torch.randn(2, 3, 16, dtype=dtype) for _ in range(3)]
        assert module(sources).dtype == dtype


if __name__ == "__main__":
    run_cases(_cases(), sys.argv[1:])
