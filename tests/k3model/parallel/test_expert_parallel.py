"""Expert-parallel LatentMoE on gloo (2 and 4 CPU processes) against the single-device layer.

Each rank builds the single-device layer from the same seed, runs it on the global batch, runs the
EP layer on its own rows and reports relative errors (`parallel_workers.py`).
"""

from __future__ import annotations

import pytest

from k3model.config import MoEConfig
from k3model.moe import LatentMoE
from k3model.parallel import ExpertParallelMoE, expert_range, launch_local

import parallel_workers as workers

TOL = 1e-5


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def ep_results(request):
    return request.param, launch_local(workers.ep_all_cases, request.param)


@pytest.mark.parametrize("case", ["plain", "rank0_only", "qat"])
def test_outputs_and_gradients_equal_single_device(ep_results, case):
    world, results = ep_results
    for rank, res in enumerate(results):
        errs = res[f"fwd_bwd/{case}"]
        for name, err in errs.items():
            if name != "rows_to_this_rank":
                assert err <= TOL, f"rank {rank}/{world} {case}: {name} rel err {err:.2e}"
        # The outputs and expert gradients take the single-device path's every operation in the
        # same order: bitwise equal, not just close.
        for name in ("out", "grad_x", "grad/w_gate_EHL", "grad/w_up_EHL", "grad/w_down_ELH"):
            assert errs[name] == 0.0, f"rank {rank}/{world} {case}: {name} rel err {errs[name]:.2e}"
    rows = [res[f"fwd_bwd/{case}"]["rows_to_this_rank"] for res in results]
    if case == "rank0_only":
        # Ranks other than 0 received no rows and still took part in every exchange.
        assert rows[0] > 0 and all(r == 0 for r in rows[1:]), rows
    else:
        assert all(r > 0 for r in rows), rows


def test_averaged_gradients_are_those_of_the_mean_loss(ep_results):
    world, results = ep_results
    for rank, res in enumerate(results):
        for name, err in res["average"].items():
            assert err <= TOL, f"rank {rank}/{world}: {name} rel err {err:.2e}"


@pytest.mark.parametrize("mode", ["quantile/histogram", "quantile/exact", "deepseek/histogram"])
def test_bias_update_uses_the_global_load(ep_results, mode):
    world, results = ep_results
    for rank, res in enumerate(results):
        r = res[f"bias/{mode}"]
        assert r["bias_norm"] > 1e-3, "the update under test moved the bias too little to tell"
        assert r["bias_step1"] <= TOL and r["bias_step2"] <= TOL, f"rank {rank}/{world} {mode}: {r}"
        assert r["ranks_disagree"] == 0.0, f"ranks hold different biases: {r}"


def test_all_to_all_with_uneven_splits(ep_results):
    """The exchange EP relies on: gloo runs all_to_all_single with uneven splits (torch 2.13)."""
    world, results = ep_results
    for rank, res in enumerate(results):
        r = res["uneven_exchange"]
        assert r["mismatch"] == 0.0, f"rank {rank}/{world} received the wrong rows"
        assert r["rows"] == (world * (world + 1) // 2 if rank == 0 else world)


def test_expert_range_splits_evenly_or_says_what_to_change():
    assert [expert_range(8, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(ValueError, match="divide"):
        expert_range(8, 0, 3)


def test_wrapping_needs_an_initialized_process_group():
    moe = LatentMoE(MoEConfig(d_model=16, n_routed=4, top_k=2, n_shared=0, latent_dim=8, expert_hidden=8,
                              shared_hidden=8))
    with pytest.raises(ValueError, match="init_process_group"):
        ExpertParallelMoE(moe)
