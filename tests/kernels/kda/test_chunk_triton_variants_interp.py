"""Kernel variants of `chunk_triton.TileConfig` (the fused prep with the doubling inverse, tf32
inverse, split prep, split backward, all three, the splits with 16-wide key slices) against the
default kernels (split prep, substitution inverse in tf32, split backward: the fastest correct
variant on the H200) and the fp32 recurrent reference, on the CPU under
TRITON_INTERPRET=1.

The cases run in one fresh interpreter process (`variant_cases.py`). Outputs, final state and every
gradient (dq, dk, dv, dg, dbeta, dh0) must equal the default path to 1e-5 relative for fp32 inputs and
to 1e-3 for bf16 ones (the split kernels keep their scratch in fp32, so they should agree to rounding),
and stay within fla's tolerances of the reference for bf16 inputs. With positive keys and weak gates,
where the doubling inverse fails, the default (substitution) inverse must match the fp64 recurrence.
"""

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
NAMES = ["o", "ht", "dq", "dk", "dv", "dg", "dbeta"]
FLA_TOL = {"o": 5e-3, "ht": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dg": 2e-2, "dbeta": 2e-2, "dh0": 8e-3}
# Kernels each variant must launch (each once: one forward, one backward) and the inverse precision.
X3, TF32 = {"INV_PREC=tf32x3": 1}, {"INV_PREC=tf32": 1}
SPLIT_PREP = {"_prep_pairs_kernel": 1, "_prep_solve_kernel": 1}
EXPECTED = {
    "default": {**SPLIT_PREP, "_bwd_values_kernel": 1, "_bwd_pairs_kernel": 1, **TF32},
    "fused_doubling": {"_prep_kernel": 1, "_bwd_chunk_kernel": 1, **X3},
    "tf32_inverse": {"_prep_kernel": 1, "_bwd_chunk_kernel": 1, **TF32},
    "prep_split": {**SPLIT_PREP, "_bwd_chunk_kernel": 1, **X3},
    "bwd_split": {"_prep_kernel": 1, "_bwd_values_kernel": 1, "_bwd_pairs_kernel": 1, **X3},
    "all": {**SPLIT_PREP, "_bwd_values_kernel": 1, "_bwd_pairs_kernel": 1, **TF32},
    "split_bks16": {**SPLIT_PREP, "_bwd_values_kernel": 1, "_bwd_pairs_kernel": 1, **X3},
    "substitution_fused_bwd": {**SPLIT_PREP, "_bwd_chunk_kernel": 1, **X3},
    "bwd_pairs_bf16": {**SPLIT_PREP, "_bwd_values_kernel": 1, "_bwd_pairs_kernel": 1, **TF32,
                       "PAIR_BF16 _bwd_pairs_kernel": 1},
    "pairs_bf16": {**SPLIT_PREP, "_bwd_values_kernel": 1, "_bwd_pairs_kernel": 1, **TF32,
                   "PAIR_BF16 _prep_pairs_kernel": 1, "PAIR_BF16 _bwd_pairs_kernel": 1},
}
# Variants whose arithmetic differs from the default's by design (checked against the reference only).
INEXACT = {"bwd_pairs_bf16", "pairs_bf16"}
CASES = {"fp32_h0": True, "fp32_no_h0": False, "bf16_h0": True}


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "variant_cases.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"variant cases failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return {(r["variant"], r["case"]): r for r in map(json.loads, proc.stdout.splitlines())}


def test_substitution_inverse_is_exact_where_the_doubling_fails(results):
    """Positive keys, weak gates (variant_cases.WEAK): the doubling inverse's error reaches the outputs
    and every gradient; the substitution inverse holds fp32 accuracy."""
    names = NAMES + ["dh0"]
    sub = results[("default", "fp32_weak_decay_positive_k")]
    dbl = results[("fused_doubling", "fp32_weak_decay_positive_k")]
    assert sub["finite"] and sub["launches"] == EXPECTED["default"], sub
    bad = {n: sub["vs_reference"][n] for n in names if not sub["vs_reference"][n] <= 1e-5}
    assert not bad, f"substitution inverse over 1e-5 vs the fp64 recurrence: {bad}"
    # The case really is in the regime: the doubling inverse is far off there (docs/log/kda.md).
    assert dbl["vs_reference"]["o"] > 1e3 * sub["vs_reference"]["o"], (dbl["vs_reference"], sub["vs_reference"])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("variant", [v for v in EXPECTED if v != "default" and v not in INEXACT])
def test_variant_equals_default_path(results, variant, case):
    r = results[(variant, case)]
    assert r["finite"], r
    assert r["launches"] == EXPECTED[variant], r["launches"]
    names = NAMES + (["dh0"] if CASES[case] else [])
    assert sorted(r["vs_default"]) == sorted(names)
    tol = 1e-5 if case.startswith("fp32") else 1e-3
    bad = {n: r["vs_default"][n] for n in names if not r["vs_default"][n] <= tol}  # NaN fails too
    assert not bad, f"{variant} differs from the default path: {bad}"


@pytest.mark.parametrize("variant", [v for v in EXPECTED if v not in INEXACT])
def test_variant_matches_reference(results, variant):
    for case, with_h0 in CASES.items():
        r = results[(variant, case)]
        assert r["finite"], (variant, case)
        names = NAMES + (["dh0"] if with_h0 else [])
        tol = {n: 1e-5 for n in names} if case.startswith("fp32") else FLA_TOL
        bad = {n: r["vs_reference"][n] for n in names if not r["vs_reference"][n] <= tol[n]}
        assert not bad, f"{variant}/{case} over tolerance vs the fp32 reference: {bad}"


@pytest.mark.parametrize("variant", sorted(INEXACT))
def test_bf16_pair_products_stay_within_fla_tolerances(results, variant):
    """TileConfig(bwd_pair_dtype="bf16") and with prep_pair_dtype="bf16" too: the gradients through
    the pair regions (dq, dk, dg) differ from the default's (the bf16 operands took effect) and every
    output stays within fla's tolerances of the fp32 reference, for fp32 and bf16 inputs. With the
    backward alone in bf16 the forward and dv (no pair-region product) equal the default's; with the
    prep too, the forward changes."""
    for case, with_h0 in CASES.items():
        r = results[(variant, case)]
        assert r["finite"] and r["launches"] == EXPECTED[variant], r
        forward_same = all(r["vs_default"][n] == 0.0 for n in ("o", "ht", "dv"))
        assert forward_same == (variant == "bwd_pairs_bf16"), r["vs_default"]
        assert all(r["vs_default"][n] > 0.0 for n in ("dq", "dk", "dg")), r["vs_default"]
        names = NAMES + (["dh0"] if with_h0 else [])
        bad = {n: r["vs_reference"][n] for n in names if not r["vs_reference"][n] <= FLA_TOL[n]}
        assert not bad, f"{variant}/{case} over fla's tolerance vs the fp32 reference: {bad}"


def test_default_launches_the_split_prep_with_the_substitution_inverse(results):
    for case in CASES:
        assert results[("default", case)]["launches"] == EXPECTED["default"]


def test_tile_config_rejects_unknown_precision_and_warps():
    from kernels.kda.chunk_triton import TileConfig

    with pytest.raises(ValueError, match="inverse_precision"):
        TileConfig(inverse_precision="ieee3")
    with pytest.raises(ValueError, match="warp counts"):
        TileConfig(bwd_pairs_warps=3)
    with pytest.raises(ValueError, match="bwd_pair_dtype"):
        TileConfig(bwd_pair_dtype="fp16")
    with pytest.raises(ValueError, match="split prep"):  # the fused prep has no bf16 switch
        TileConfig(prep_split=False, inverse="doubling", prep_pair_dtype="bf16")
