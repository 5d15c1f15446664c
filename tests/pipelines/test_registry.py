"""The model registry: one version per distinct checkpoint, no copy in MLflow's artifacts, sources
relative to the home (a moved home still loads), and the one documented load call."""

import dataclasses
import shutil

import pytest
import torch
from mlflow.tracking import MlflowClient

from k3model.checkpoint import save_checkpoint
from k3model.config import get_profile
from k3model.model import K3Model
from pipelines.registry import checkpoint_path, load_model
from pipelines.resources import resources_for


def _register(mlflow, rel, sha, run_id):
    return mlflow.register_checkpoint(run_id, "k3-smoke-base", rel, sha, {"profile": "smoke"}, "test model")


def test_one_version_per_checkpoint_and_load_from_a_moved_home(tmp_path):
    home = tmp_path / "home"
    mlflow = resources_for(home)["mlflow"]
    client = MlflowClient(mlflow.resolved_tracking_uri())
    run = client.create_run(mlflow.experiment_id())
    torch.manual_seed(0)
    model = K3Model(get_profile("smoke").model)
    manifest = {"config": {"model": dataclasses.asdict(model.cfg)}}
    paths, versions = [], []
    for i, seed in enumerate((0, 0, 1)):
        torch.manual_seed(seed)
        state = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in model.state_dict().items()}
        info = save_checkpoint(home / "checkpoints" / "smoke" / "base_model" / f"run{i}", state, manifest)
        paths.append(info.path)
        version, created = _register(mlflow, info.path.relative_to(home).as_posix(), info.sha256, run.info.run_id)
        versions.append((str(version.version), created))
    # Identical bytes (seed 0 twice) give no new version.
    assert versions == [("1", True), ("1", False), ("2", True)]
    client.set_registered_model_alias("k3-smoke-base", "champion", "2")
    assert client.list_artifacts(run.info.run_id) == []  # the checkpoint is not copied into MLflow

    loaded, loaded_manifest = load_model("k3-smoke-base@champion", home=home)
    assert checkpoint_path("k3-smoke-base/1", home=home) == paths[0]
    assert isinstance(loaded, K3Model) and loaded_manifest["config"]["model"]["name"] == "smoke"

    moved = tmp_path / "moved"
    shutil.move(home, moved)
    assert checkpoint_path("k3-smoke-base@champion", home=moved) == moved / paths[2].relative_to(home)
    again, _ = load_model("k3-smoke-base@champion", home=moved)
    for (k, a), b in zip(loaded.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k

    with pytest.raises(ValueError, match="write 'name@alias'"):
        load_model("k3-smoke-base", home=moved)


def test_a_version_whose_source_leaves_the_home_is_refused_unless_a_shared_store_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("K3_SHARED_STORE", raising=False)
    home, store = tmp_path / "home", tmp_path / "store"
    mlflow = resources_for(home)["mlflow"]
    client = MlflowClient(mlflow.resolved_tracking_uri())
    run = client.create_run(mlflow.experiment_id())
    torch.manual_seed(0)
    model = K3Model(get_profile("smoke").model)
    info = save_checkpoint(store / "base", model.state_dict(), {"config": {"model": dataclasses.asdict(model.cfg)}})
    (home / "checkpoints").mkdir(parents=True, exist_ok=True)
    (home / "checkpoints" / "link").symlink_to(store / "base")
    sources = {"absolute": str(info.path), "dotdot": "checkpoints/../../store/base", "symlink": "checkpoints/link",
               "system": "/etc", "the home itself": "."}
    for i, (case, source) in enumerate(sources.items()):
        version, _ = mlflow.register_checkpoint(run.info.run_id, "k3-smoke-base", source, f"{i:064x}",
                                                {"profile": "smoke"}, case)
        with pytest.raises(ValueError, match=rf"version {version.version}\) has source .*outside the home.*K3_SHARED_STORE"):
            load_model(f"k3-smoke-base/{version.version}", home=home)
    # Named explicitly, the shared store is allowed (argument or environment), and nothing else is.
    assert checkpoint_path("k3-smoke-base/1", home=home, shared_store=store) == info.path.resolve()
    monkeypatch.setenv("K3_SHARED_STORE", str(store))
    loaded, _ = load_model("k3-smoke-base/2", home=home)
    assert isinstance(loaded, K3Model)
    with pytest.raises(ValueError, match="outside the home .* and the shared store"):
        checkpoint_path("k3-smoke-base/4", home=home)
