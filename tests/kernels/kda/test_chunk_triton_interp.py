"""The Triton KDA kernels against the fp32 recurrent reference, on the CPU under TRITON_INTERPRET=1.

The cases live in `interp_cases.py` and run in one fresh interpreter process (see its docstring);
each test here checks one case's metrics. fp32 cases hold to 1e-5 relative error (the interpreter
computes in fp32); bf16 inputs to fla's tolerances.
"""

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
GRADS = ["dq", "dk", "dv", "dg", "dbeta"]


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "interp_cases.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"interpreter cases failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}


@pytest.mark.parametrize("case, with_h0", [("odd_len_h0", True), ("two_chunks_wide", False)])
def test_fp32_outputs_and_every_gradient(results, case, with_h0):
    r = results[case]
    assert r["finite"]
    names = ["o", "ht"] + GRADS + (["dh0"] if with_h0 else [])
    for name in names:
        assert r[name] <= 1e-5, (name, r[name])


def test_bf16_inputs_within_fla_tolerances(results):
    r = results["bf16"]
    assert r["finite"]
    tol = {"o": 5e-3, "ht": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dg": 2e-2, "dbeta": 2e-2, "dh0": 8e-3}
    for name, t in tol.items():
        assert r[name] <= t, (name, r[name])


def test_strongly_decaying_gates_stay_finite_and_exact(results):
    r = results["strong_decay"]
    assert r["finite"]
    for name in ["o", "ht"] + GRADS + ["dh0"]:
        assert r[name] <= 1e-5, (name, r[name])


def test_extreme_decay_stays_finite(results):
    r = results["extreme_decay"]
    assert r["finite"], r


def test_future_tokens_and_gates_do_not_reach_the_prefix(results):
    r = results["causality"]
    for name in ["o", "dq", "dk", "dv", "dg", "dbeta"]:
        assert r[name] == 0.0, (name, r[name])


def test_decode_step_updates_state_in_place(results):
    r = results["decode"]
    assert r["o"] <= 1e-6 and r["state"] <= 1e-6, r


def test_the_recurrent_kernel_over_t_tokens_is_t_one_token_calls_bitwise(results):
    r = results["recurrent"]
    assert r["o"] <= 1e-6 and r["state"] <= 1e-6, r
    assert r["steps_gap"] == 0.0 and r["h0_kept"], r


def test_gate_gradient_under_strong_decay_with_tf32_products(results):
    # With the main diagonal of dA_qk inside the tf32 pair products, dg was 7.2e-3 here (the other
    # gradients ≤ 1.8e-3); with it added exactly, 1.1e-3. On the H200 at (1, 777, ·, 128) bf16 the
    # same cause gave 2.2e-2 against fla-core's 2.6e-3 (docs/log/kda.md).
    r = results["strong_decay_tf32"]
    for name in ["o", "ht"] + GRADS + ["dh0"]:
        assert r[name] <= 2.5e-3, (name, r[name])


def test_default_inverse_is_exact_for_positive_keys_with_weak_decay(results):
    r = results["positive_keys_weak_decay"]
    for name in ["o", "ht"] + GRADS + ["dh0"]:
        assert r[name] <= 1e-5, (name, r[name])


def test_tile_config_is_passed_explicitly(results):
    r = results["explicit_tiles"]
    assert r["bks"] == [32, 32, 16, 16], r["bks"]  # default slices, then the ones passed
    for name in ["o", "ht"] + GRADS + ["dh0"]:
        assert r[name] <= 1e-6, (name, r[name])


def test_tile_config_rejects_bad_warps_and_key_slices():
    from kernels.kda.triton.common import TileConfig

    with pytest.raises(ValueError, match="warp counts"):
        TileConfig(bwd_pairs_warps=3)
    with pytest.raises(ValueError, match="key slices"):
        TileConfig(prep_key_slice=24)
