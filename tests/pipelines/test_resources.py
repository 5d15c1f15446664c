"""Resources against the real services: a local Ray cluster, a sqlite MLflow store, the home."""

import os
from pathlib import Path

import dagster as dg
import pytest
import torch
from mlflow.tracking import MlflowClient

from k3model.checkpoint import save_checkpoint
from pipelines.instance import dagster_home, k3_environ
from pipelines.resources import (CheckpointStore, MlflowResource, RayResource, check_profile_name, k3_home,
                                 local_gpu_count)


def test_profile_names():
    assert check_profile_name("smoke") == "smoke"
    with pytest.raises(ValueError, match=r"--profile = 'big' is not a profile: choose one of smoke, tiny, small"):
        check_profile_name("big", field="--profile")
    with pytest.raises(ValueError, match="parameter accounting only"):
        check_profile_name("k3")


def test_ray_resource_starts_one_cluster_with_the_machines_gpus():
    import ray
    if ray.is_initialized():
        pytest.skip("a Ray cluster is already running in this process")
    # Defined here so cloudpickle ships it by value: workers cannot import test modules.
    def _task_env() -> dict:
        import os
        import torch
        return {"omp": os.environ.get("OMP_NUM_THREADS"), "threads": torch.get_num_threads()}

    res = RayResource()
    with dg.build_resources({"ray": res}) as resources:
        ray_res = resources.ray
        assert not ray.is_initialized()  # started lazily, on first use
        # Workers started for 1-CPU tasks (Ray sets OMP_NUM_THREADS=1 in them) and reused below.
        assert [o["threads"] for o in ray_res.map(_task_env, [(), ()], num_cpus=1)] == [1, 1]
        out = ray_res.run(_task_env)
        assert ray_res.cluster_gpus() == local_gpu_count() == torch.cuda.device_count()
        assert ray.cluster_resources()["CPU"] == os.cpu_count()
        # The task gets a whole node's CPUs, so torch is not left on one thread.
        assert out["threads"] == os.cpu_count()
        address = ray.get_runtime_context().gcs_address
        results = ray_res.map(_task_env, [(), ()])
        assert len(results) == 2
        assert ray.get_runtime_context().gcs_address == address  # the same cluster throughout
        if local_gpu_count() == 0:
            with pytest.raises(ValueError, match="asked Ray for 1 GPU"):
                ray_res.run(_task_env, num_gpus=1.0)
    assert not ray.is_initialized()  # stopped with the run


def test_mlflow_run_metrics_and_model_version(tmp_path):
    mlflow = MlflowResource(tracking_uri=f"sqlite:///{tmp_path}/mlflow/mlflow.db",
                            artifact_root=str(tmp_path / "artifacts"))
    ckpt = save_checkpoint(tmp_path / "ckpt", torch.nn.Linear(2, 2).state_dict())

    @dg.asset
    def probe(context: dg.AssetExecutionContext):
        with mlflow.start_run(context, params={"lr": 0.1}, tags={"k3/profile": "smoke"}) as run:
            history = [{"step": s, "train/loss": 4.0 - s} for s in (1, 2, 3)]
            # Step 2 was logged live already: only 1 and 3 are added.
            mlflow.log_metrics(run.info.run_id, {"train/loss": 2.0}, step=2)
            n = mlflow.log_history(run.info.run_id, history, skip_steps=frozenset({2}))
            mlflow.log_rows(run.info.run_id, [{"variant": "scattered", "accuracy": 0.5}], "eval/grid.json")
            version, _ = mlflow.register_checkpoint(run.info.run_id, "probe-model", ckpt.path, ckpt.sha256,
                                                    {"profile": "smoke"}, "a probe", home=tmp_path)
        # A partition's run leads with the partition (MLflow's run table cuts long names).
        part = mlflow.create_run(context, {}, partition="coding_agents|max")
        mlflow.end_run(part, "FINISHED")
        return dg.MaterializeResult(metadata={"n": n, "run": mlflow.run_url(run), "version": version.version,
                                              "partition_run": part.info.run_name})

    result = dg.materialize([probe], instance=dg.DagsterInstance.ephemeral())
    md = result.asset_materializations_for_node("probe")[0].metadata
    assert md["n"].value == 2 and md["run"].value.startswith("/k3/mlflow/runs/")
    client = MlflowClient(mlflow.resolved_tracking_uri())
    run = client.get_run(md["run"].value.rsplit("/", 1)[1])
    assert run.data.tags["dagster_run_id"] == result.run_id and run.data.tags["asset"] == "probe"
    assert run.data.params == {"lr": "0.1"} and run.info.status == "FINISHED"
    assert run.info.run_name == f"probe-{result.run_id[:8]}"
    assert md["partition_run"].value == f"coding_agents|max probe-{result.run_id[:8]}"
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")) == \
        [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "eval")] == ["eval/grid.json"]
    version = client.get_model_version("probe-model", md["version"].value)
    # The source is the pyfunc model logged to the run (an MLflow server accepts it; a path it would not).
    assert version.source == f"runs:/{run.info.run_id}/model"
    assert version.tags == {"sha256": ckpt.sha256, "profile": "smoke", "checkpoint": "ckpt"}


def test_mlflow_run_marked_failed_when_the_asset_fails(tmp_path):
    mlflow = MlflowResource(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=str(tmp_path / "a"))

    @dg.asset
    def broken(context: dg.AssetExecutionContext):
        with mlflow.start_run(context, params={}):
            raise ValueError("boom")

    result = dg.materialize([broken], instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    client = MlflowClient(mlflow.resolved_tracking_uri())
    exp = client.get_experiment_by_name("k3")
    [run] = client.search_runs([exp.experiment_id])
    assert run.info.status == "FAILED"


def test_home_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_HOME", str(tmp_path / "home"))
    assert k3_home() == (tmp_path / "home").resolve()
    env = k3_environ("smoke")
    assert env["DAGSTER_HOME"] == str(tmp_path / "home" / "dagster") and env["K3_PROFILE"] == "smoke"
    config = (dagster_home() / "dagster.yaml").read_text()
    assert "enabled: false" in config and "max_concurrent_runs: 4" in config and "run_monitoring:" in config
    store = CheckpointStore()
    assert store.checkpoint_dir("tiny", "pretrain_stage_1", "r1") == \
        (tmp_path / "home" / "checkpoints" / "tiny" / "pretrain_stage_1" / "r1").resolve()
    assert MlflowResource().resolved_tracking_uri() == f"sqlite:///{(tmp_path / 'home' / 'mlflow' / 'mlflow.db').resolve()}"


def test_end_leftover_ray_processes_ends_only_this_homes_ray_processes(tmp_path):
    import subprocess
    import sys
    import time

    from pipelines.resources import end_leftover_ray_processes
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen(sleep + ["ray::RuntimeEnvAgent"], env={**os.environ, "K3_HOME": str(tmp_path / "a")})
    other_home = subprocess.Popen(sleep + ["ray::RuntimeEnvAgent"], env={**os.environ, "K3_HOME": str(tmp_path / "b")})
    not_ray = subprocess.Popen(sleep + ["worker"], env={**os.environ, "K3_HOME": str(tmp_path / "a")})
    try:
        time.sleep(0.5)
        assert end_leftover_ray_processes(str(tmp_path / "a"), grace_s=5.0) == [ours.pid]
        assert ours.wait(timeout=10) is not None
        assert other_home.poll() is None and not_ray.poll() is None
    finally:
        for p in (ours, other_home, not_ray):
            p.kill()
            p.wait()
