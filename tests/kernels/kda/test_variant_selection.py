"""How the GPU benchmarks pick a KDA TileConfig (`benchmarks/kda_variants.py`): `--tiles best:SWEEP`
must take the fastest variant that passed its correctness check, never a faster wrong one."""

import json

import pytest

from benchmarks.kda_variants import VARIANTS, fastest_correct, tile_config_from_arg
from kernels.kda.chunk_triton import FUSED_DOUBLING, TileConfig


def write_sweep(tmp_path, variants):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"variants": variants}))
    return str(path)


def test_best_is_the_fastest_correct_variant(tmp_path):
    sweep = write_sweep(tmp_path, {
        "fused_doubling": {"correct": True, "ms": {"fwdbwd": 10.8}},
        "combined_w4": {"correct": False, "ms": {"fwdbwd": 7.0}},  # faster, but wrong: never picked
        "subst_w8": {"correct": True, "ms": {"fwdbwd": 9.1}},
        "bwd_split_w4": {"correct": True, "status": "timeout after 90 s"},  # checked, never timed
    })
    assert fastest_correct(sweep) == ("subst_w8", VARIANTS["subst_w8"])
    cfg = tile_config_from_arg("best:" + sweep)
    assert (cfg.prep_pairs_warps, cfg.prep_solve_warps) == (8, 8)


def test_a_sweep_with_nothing_correct_and_timed_is_an_error(tmp_path):
    sweep = write_sweep(tmp_path, {"combined_w4": {"correct": False, "ms": {"fwdbwd": 7.0}}})
    with pytest.raises(ValueError, match="no variant is both correct and timed"):
        tile_config_from_arg("best:" + sweep)


def test_names_overrides_and_bad_text():
    assert tile_config_from_arg("default") == TileConfig()
    assert tile_config_from_arg("fused_doubling").inverse == FUSED_DOUBLING.inverse == "doubling"
    cfg = tile_config_from_arg("bwd_warps=4,bwd_split=false,inverse_precision=tf32x3")
    assert (cfg.bwd_warps, cfg.bwd_split, cfg.inverse_precision) == (4, False, "tf32x3")
    with pytest.raises(ValueError, match="name=value"):
        tile_config_from_arg("no_such_variant")
    with pytest.raises(ValueError, match="warp counts"):
        tile_config_from_arg("bwd_warps=3")
