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
