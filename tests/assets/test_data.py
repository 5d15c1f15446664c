"""Data assets: materialize the group, call assets directly, lineage by profile, bad input."""

import dagster as dg
import pytest
from conftest import error_text
from mlflow.tracking import MlflowClient

from assets.data import DataConfig, corpus, image_data, tokenizer
from k3model.checkpoint import sha256_file
from pipelines.resources import resources_for

NAMES = ("corpus", "tokenizer", "clue_data", "image_data")


def _metadata(result, name):
    return {k: v.value for k, v in result.asset_materializations_for_node(name)[0].metadata.items()}


def test_group_materializes_with_content_versions(data_run, smoke_resources):
    instance, result = data_run
    for name in NAMES:
        md = _metadata(result, name)
        event = instance.get_latest_materialization_event(dg.AssetKey(name)).asset_materialization
        assert md["sha256"] == sha256_file(md["path"]) == event.tags["dagster/data_version"], name
        assert event.tags["k3/profile"] == "smoke"
        assert md["dagster/row_count"] > 0 and md["profile"] == "smoke"
        # The file sits in a directory named by its own hash.
        assert md["path"].split("/")[-2] == md["sha256"][:16]
    assert _metadata(result, "tokenizer")["vocab_size"] == 512
    assert _metadata(result, "clue_data")["num_cells"] >= 4


def test_one_mlflow_run_per_asset(data_run, smoke_resources):
    _, result = data_run
    client = MlflowClient(smoke_resources["mlflow"].resolved_tracking_uri())
    exp = client.get_experiment_by_name("k3")
    runs = client.search_runs([exp.experiment_id], f"tags.dagster_run_id = '{result.run_id}'")
    assert sorted(r.data.tags["asset"] for r in runs) == sorted(NAMES)
    assert all(r.info.status == "FINISHED" for r in runs)
    by_asset = {r.data.tags["asset"]: r for r in runs}
    assert by_asset["corpus"].data.metrics["data/rows"] == _metadata(result, "corpus")["dagster/row_count"]
    assert by_asset["corpus"].data.params["profile"] == "smoke"
    # The image contact sheet is an artifact of the image_data run.
    artifacts = [a.path for a in client.list_artifacts(by_asset["image_data"].info.run_id)]
    assert artifacts == ["preview.png"]


def test_direct_call_reproduces_the_same_bytes(data_run, smoke_resources):
    instance, result = data_run
    with dg.build_asset_context(resources=smoke_resources, instance=instance) as ctx:
        out = corpus(ctx, DataConfig(seed=0))
    assert out.data_version.value == _metadata(result, "corpus")["sha256"]
    with dg.build_asset_context(resources=smoke_resources, instance=instance) as ctx:
        other = image_data(ctx, DataConfig(seed=1))
    assert other.data_version.value != _metadata(result, "image_data")["sha256"]


def test_missing_upstream_names_the_asset_to_materialize(smoke_resources):
    with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
            pytest.raises(dg.Failure) as err:
        tokenizer(ctx)
    assert "corpus has not been materialized for profile 'smoke'" in err.value.description
    assert "Materialize corpus first" in err.value.description


def test_profiles_do_not_feed_each_other(data_run, home):
    instance, _ = data_run
    with dg.build_asset_context(resources=resources_for("tiny", home), instance=instance) as ctx, \
            pytest.raises(dg.Failure, match="not been materialized for profile 'tiny'"):
        tokenizer(ctx)


def test_invalid_profile_fails_naming_the_field(home):
    with pytest.raises(Exception) as err:
        dg.materialize([image_data], resources=resources_for("huge", home),
                       instance=dg.DagsterInstance.ephemeral())
    text = error_text(err.value)
    assert "resources.profile.config.name = 'huge' is not a profile" in text
    assert "smoke, tiny, small" in text


def test_k3_profile_is_refused_for_runs(home):
    with pytest.raises(Exception) as err:
        dg.materialize([image_data], resources=resources_for("k3", home), instance=dg.DagsterInstance.ephemeral())
    assert "parameter accounting only" in error_text(err.value)


def test_invalid_config_value_names_the_field(home):
    with pytest.raises(Exception) as err:
        dg.materialize([image_data], resources=resources_for("smoke", home), instance=dg.DagsterInstance.ephemeral(),
                       run_config={"ops": {"image_data": {"config": {"seed": -1}}}})
    assert "seed" in error_text(err.value) and "greater than or equal to 0" in error_text(err.value)
