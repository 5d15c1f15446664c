"""checkpoint_sound: a blocking check that stops a checkpoint with a NaN weight or a diverged logged loss
from becoming an upstream; a sound checkpoint passes and its downstream runs. Both checkpoint checks
(with checkpoint_intact, tested on a stage in tests/assets/test_pretrain.py) are on every checkpoint
asset, once."""

import dagster as dg
import pytest
import torch

from assets import checkpoint_checks
from assets.lineage import key
from assets.profiles import build_profile
from k3model.checkpoint import save_checkpoint
from pipelines.resources import resources_for


def _defs(tmp_path, weights, logged_losses, metrics):
    """A `smoke/sft_policy` asset that publishes `weights` (MLflow run with `logged_losses` by step),
    its checkpoint_sound check, and a downstream asset that records whether it ran."""
    home = tmp_path / "home"
    mlflow = resources_for(home)["mlflow"]
    ran = []

    @dg.asset(key=key("smoke", "sft_policy"))
    def sft_policy(context) -> dg.MaterializeResult:
        client = mlflow.client()
        run = client.create_run(mlflow.experiment_id())
        for step, loss in enumerate(logged_losses, 1):
            client.log_metric(run.info.run_id, "train/main", loss, step=step)
        info = save_checkpoint(home / "ckpt" / context.run_id, weights, {"metrics": metrics})
        # As every checkpoint asset does: the data version is the weights' sha256.
        return dg.MaterializeResult(metadata={"path": dg.MetadataValue.path(str(info.path)),
                                              "mlflow_run": dg.MetadataValue.url(mlflow.run_url(run))},
                                    data_version=dg.DataVersion(info.sha256))

    @dg.asset(key=key("smoke", "rl_specialist"), deps=[sft_policy])
    def downstream() -> None:
        ran.append(True)

    return [sft_policy, downstream, *checkpoint_checks.build("smoke", [sft_policy])], mlflow, ran


def _run(tmp_path, weights, losses=(3.0, 2.5, 2.0), metrics=None):
    defs, mlflow, ran = _defs(tmp_path, weights, list(losses), metrics or {"train/final_loss": 2.0})
    result = dg.materialize(defs, instance=dg.DagsterInstance.ephemeral(), resources={"mlflow": mlflow},
                            raise_on_error=False)
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations[checkpoint_checks.INTACT_NAME].passed, evaluations[checkpoint_checks.INTACT_NAME].description
    return evaluations[checkpoint_checks.CHECK_NAME], ran


def _weights():
    torch.manual_seed(0)
    return {"w": torch.randn(8, 8), "b": torch.zeros(8), "codes": torch.zeros(4, dtype=torch.uint8)}


def test_a_sound_checkpoint_passes_and_its_downstream_runs(tmp_path):
    evaluation, ran = _run(tmp_path, _weights())
    assert evaluation.passed, evaluation.description
    assert ran == [True]


def test_a_planted_nan_weight_blocks_the_downstream_naming_the_tensor(tmp_path):
    weights = _weights()
    weights["w"][3, 5] = float("nan")
    weights["b"][0] = float("inf")
    evaluation, ran = _run(tmp_path, weights)
    assert not evaluation.passed
    assert "2 non-finite weights in 2 tensor(s)" in evaluation.description
    assert "w (1)" in evaluation.description and "b (1)" in evaluation.description
    assert ran == []  # blocking: the bad checkpoint never became an upstream


@pytest.mark.parametrize("losses, metrics, message", [
    ((3.0, float("nan"), 2.0), None, r"MLflow run \w+ logged 1 non-finite point\(s\): train/main@2=nan"),
    ((3.0, 2.5, 2.0), {"train/final_loss": float("inf")}, "non-finite training metrics recorded: train/final_loss=inf"),
])
def test_a_loss_that_diverged_anywhere_blocks_the_downstream(tmp_path, losses, metrics, message):
    evaluation, ran = _run(tmp_path, _weights(), losses, metrics)
    assert not evaluation.passed
    assert evaluation.description and __import__("re").search(message, evaluation.description)
    assert ran == []


def test_every_checkpoint_asset_of_a_profile_has_the_blocking_check():
    defs = build_profile("smoke")
    for name in (checkpoint_checks.CHECK_NAME, checkpoint_checks.INTACT_NAME):
        checked = [spec for c in defs.checks for spec in c.check_specs if spec.name == name]
        assert sorted(s.asset_key.path[-1] for s in checked) == sorted(checkpoint_checks.CHECKPOINT_ASSETS)
        assert all(spec.blocking for spec in checked)


def test_checkpoint_intact_refuses_a_valid_checkpoint_that_is_not_the_one_recorded(tmp_path):
    """Re-hashed against the manifest *and* the version the materialization recorded, for each
    materialized partition of a partitioned asset (rl_specialist)."""
    from assets.lineage import PROFILE_TAG
    torch.manual_seed(0)
    good = save_checkpoint(tmp_path / "a", _weights())
    other = save_checkpoint(tmp_path / "b", {"w": torch.ones(2)})
    specialist = next(a for a in build_profile("smoke").assets if a.key == key("smoke", "rl_specialist"))
    [intact] = [c for c in checkpoint_checks.build("smoke", [specialist])
                if next(iter(c.check_keys)).name == checkpoint_checks.INTACT_NAME]
    instance = dg.DagsterInstance.ephemeral()
    for partition, path in (("general_tasks|low", good.path), ("coding_agents|max", other.path)):
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key("smoke", "rl_specialist"), partition=partition,
            metadata={"path": dg.MetadataValue.path(str(path)), "sha256": good.sha256}, tags={PROFILE_TAG: "smoke"}))
    result = intact(dg.build_asset_check_context(instance=instance))
    assert not result.passed and result.metadata["checkpoints"].value == 2
    assert result.description.startswith(f"rl_specialist[coding_agents|max]: checkpoint {other.path} is damaged")
    assert "general_tasks|low" not in result.description
