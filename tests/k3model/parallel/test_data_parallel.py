"""Data-parallel training step (gloo, 2 CPU processes) against one process on the concatenated batch,
and the two launchers (torch.multiprocessing, Ray)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from k3model.parallel import DataParallelConfig, launch_local, run_data_parallel_local

import parallel_workers as workers


@pytest.fixture(scope="module")
def dp_results():
    return launch_local(workers.dp_cases, 2)


@pytest.mark.parametrize("case", ["dp", "dp+ep"])
def test_one_step_equals_single_process_on_the_concatenated_batch(dp_results, case):
    for rank, res in enumerate(dp_results):
        r = res[case]
        # Weights after one AdamW step, and the step itself (AdamW's first update is ±lr where the
        # gradient is well above eps, so the update is the stricter comparison).
        assert r["params"] <= 1e-5, f"rank {rank} {case}: {r}"
        assert r["update"] <= 5e-5, f"rank {rank} {case}: {r}"
        assert r["loss"] <= 1e-5 and r["grad_norm"] <= 1e-5, f"rank {rank} {case}: {r}"
        # The bias moved (quantile balancing) and moved exactly as single-process.
        assert r["bias_norm"] > 1e-4 and r["bias"] <= 1e-5, f"rank {rank} {case}: {r}"


def test_config_rejects_what_cannot_run():
    with pytest.raises(ValueError, match="nccl"):
        DataParallelConfig(backend="nccl", device="cpu")
    with pytest.raises(ValueError, match="k3"):
        DataParallelConfig(profile="k3")
    with pytest.raises(ValueError, match="world_size"):
        DataParallelConfig(world_size=0)


@pytest.mark.slow
def test_ray_launcher_runs_the_same_steps_as_the_local_launcher():
    pytest.importorskip("ray")
    from pipelines.ray_launch import run_data_parallel
    cfg = DataParallelConfig(profile="smoke", world_size=2, steps=2, warmup_steps=1, batch_size=1, seq_len=32)
    ray_res = run_data_parallel(cfg)
    local_res = run_data_parallel_local(cfg)
    assert ray_res["world_size"] == 2 and ray_res["tokens_per_s"] > 0
    assert math.isfinite(ray_res["metrics"]["train/total"])
    # Same seed, same random batches, same step: the launchers differ only in how ranks start.
    for key in ("train/total", "train/grad_norm", "moe/load_max_over_mean"):
        assert ray_res["metrics"][key] == pytest.approx(local_res["metrics"][key], rel=1e-6), key


def test_adamw_groups_match_pretrain():
    """build_adamw restates pretrain.build_optimizer (which this package cannot import); keep them equal."""
    from k3model.parallel.data_parallel import build_adamw
    from k3model.train.pretrain import build_optimizer
    model = workers.smoke_model()
    ours, theirs = build_adamw(model, 1e-3, 0.1), build_optimizer(model, 1e-3, 0.1)
    assert len(ours.param_groups) == len(theirs.param_groups)
    for a, b in zip(ours.param_groups, theirs.param_groups):
        assert [id(p) for p in a["params"]] == [id(p) for p in b["params"]]
        for key in ("lr", "betas", "eps", "weight_decay"):
            assert a[key] == b[key], key


def test_imports_with_only_torch_present():
    """The GPU machine has no Ray and the library must not need datagen's dependencies there."""
    blocked = ("ray", "datagen", "pyarrow", "tokenizers", "safetensors", "dagster", "mlflow")
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}: raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import k3model.parallel, pipelines.ray_launch, benchmarks.model.multigpu\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_failing_rank_raises_in_the_launcher_instead_of_hanging():
    with pytest.raises(Exception, match="rank 1 fails on purpose"):
        launch_local(workers.fail_on_rank1, 2)
