"""The MoE row ops in Triton (kernels/moe_rows/triton.py) on a CUDA GPU at the small profile's size of
one micro-batch: M = 32,768 tokens, K = 4 (R = 131,072 rows), L = 512, bf16 and fp32, against
LatentMoE's index_select / index_add formula in float64 (moe_rows_references.py); and a LatentMoE
training forward + backward under bf16 autocast through the ops against the same layer through the
index path. Skipped without CUDA (CI has none); run on the H200 with
`pytest tests/kernels/moe_rows/test_moe_rows_triton_gpu.py`.

Tolerances: the outputs stored in bf16 (dz, u, dy) 5e-3 relative RMS (2⁻⁹ relative rounding, once;
1.7e-3 in the interpreter); fp32 1e-6 (sums of K terms); dp, an fp32 sum of 512 products, 1e-5. The
layer: its output and every gradient within 2e-2 of the index path's (that path adds the dispatch's
gradients with bf16 atomics, rounding after every add; a missing or misplaced row is O(1) off).
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_rows_references import make_inputs, reference, rel  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

M, K, L = 32768, 4, 512


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ops_match_the_index_formula(dtype):
    from kernels.moe_rows import combine_rows, dispatch_rows

    t = make_inputs(M, K, L, dtype, seed=3, device="cuda")
    want = reference(t)
    z = t["z"].clone().requires_grad_(True)
    z_R = dispatch_rows(z, t["token_R"], t["inv_MK"])
    z_R.backward(t["dz_R"])
    y, p = t["y"].clone().requires_grad_(True), t["p"].clone().requires_grad_(True)
    u = combine_rows(y, p, t["inv_MK"], dtype)
    u.backward(t["du"])
    assert torch.equal(z_R, t["z"].index_select(0, t["token_R"]))
    tol = 5e-3 if dtype == torch.bfloat16 else 1e-6
    errors = {"dz": rel(z.grad, want["dz"]), "u": rel(u, want["u"]), "dy": rel(y.grad, want["dy"]),
              "dp": rel(p.grad, want["dp"])}
    assert all(errors[n] <= tol for n in ("dz", "u", "dy")), errors
    assert errors["dp"] <= 1e-5, errors


def test_a_latent_moe_trains_the_same_through_the_ops_and_the_index_path(monkeypatch):
    import k3model.moe as moe_module
    from k3model.config import get_profile

    torch.manual_seed(0)
    layer = moe_module.LatentMoE(get_profile("small").model.moe()).cuda().train()
    x = torch.randn(4, 2048, layer.cfg.d_model, device="cuda")

    def run():
        layer.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(xi)
        y.float().square().mean().backward()
        return [y.detach(), xi.grad] + [p.grad.clone() for p in layer.parameters()]

    with_ops = run()
    monkeypatch.setattr(moe_module, "dispatch_rows", None)
    index_path = run()
    names = ["y", "dx"] + [n for n, _ in layer.named_parameters()]
    errors = {n: rel(a, b) for n, a, b in zip(names, with_ops, index_path)}
    assert all(e <= 2e-2 for e in errors.values()), errors
