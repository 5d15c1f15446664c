"""Data assets: materialize the group, call assets directly, one lineage per profile, bad input."""

import dagster as dg
import pytest
from conftest import error_text
from mlflow.tracking import MlflowClient

from assets import data
from assets.data import DataConfig
from assets.lineage import key
from k3model.checkpoint import sha256_file

NAMES = ("corpus", "tokenizer", "clue_data", "image_data")
SMOKE = {a.key.path[-1]: a for a in data.build("smoke")}


def _metadata(result, name, profile="smoke"):
    return {k: v.value for k, v in result.asset_materializations_for_node(f"{profile}__{name}")[0].metadata.items()}


def _latest(instance, profile, name):
    return instance.get_latest_materialization_event(key(profile, name)).asset_materialization


def test_group_materializes_with_content_versions(data_run):
    instance, result = data_run
    for name in NAMES:
        md = _metadata(result, name)
        event = _latest(instance, "smoke", name)
        assert md["sha256"] == sha256_file(md["path"]) == event.tags["dagster/data_version"], name
        assert event.tags["k3/profile"] == "smoke"
        assert md["dagster/row_count"] > 0 and md["profile"] == "smoke"
        # The file sits in a directory named by its own hash.
        assert md["path"].split("/")[-2] == md["sha256"][:16]
    assert _metadata(result, "tokenizer")["vocab_size"] == 512
    assert _metadata(result, "clue_data")["num_cells"] >= 4
    # Pictures are Markdown with the PNG as a data URI, not file paths; the small one is short
    # enough for the UI to show in the metadata table itself.
    assert _metadata(result, "image_data")["preview_png"].startswith("![the first 16 images (smoke)](data:image/png;base64,iVBOR")
    first = _metadata(result, "image_data")["first_images"]
    assert first.startswith("![the first 4 images (smoke)](data:image/png;base64,iVBOR") and len(first) < 1000
    # The run carries its profile, although materialize() set no tag.
    assert instance.get_run_by_id(result.run_id).tags["k3/profile"] == "smoke"


def test_one_mlflow_run_per_asset(data_run, smoke_resources):
    _, result = data_run
    client = MlflowClient(smoke_resources["mlflow"].resolved_tracking_uri())
    exp = client.get_experiment_by_name("k3")
    # A model-training experiment: MLflow's UI opens it on its runs, not on the GenAI traces view.
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([exp.experiment_id], f"tags.dagster_run_id = '{result.run_id}'")
    assert sorted(r.data.tags["asset"] for r in runs) == sorted(f"smoke/{n}" for n in NAMES)
    assert all(r.info.status == "FINISHED" for r in runs)
    by_asset = {r.data.tags["asset"]: r for r in runs}
    assert by_asset["smoke/corpus"].data.metrics["data/rows"] == _metadata(result, "corpus")["dagster/row_count"]
    assert by_asset["smoke/corpus"].data.params["profile"] == "smoke"
    # The image contact sheet is an artifact of the image_data run.
    artifacts = [a.path for a in client.list_artifacts(by_asset["smoke/image_data"].info.run_id)]
    assert artifacts == ["preview.png"]
    # Links go through `k3 ui`'s redirect, not to a port fixed when the asset ran.
    run = by_asset["smoke/corpus"]
    assert _metadata(result, "corpus")["mlflow_run"] == f"/k3/mlflow/runs/{exp.experiment_id}/{run.info.run_id}"


def test_direct_call_reproduces_the_same_bytes(data_run, smoke_resources):
    instance, result = data_run
    with dg.build_asset_context(resources=smoke_resources, instance=instance) as ctx:
        out = SMOKE["corpus"](ctx, DataConfig(seed=0))
    assert out.data_version.value == _metadata(result, "corpus")["sha256"]
    with dg.build_asset_context(resources=smoke_resources, instance=instance) as ctx:
        other = SMOKE["image_data"](ctx, DataConfig(seed=1))
    assert other.data_version.value != _metadata(result, "image_data")["sha256"]


def test_missing_upstream_names_the_asset_to_materialize(smoke_resources):
    with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
            pytest.raises(dg.Failure) as err:
        SMOKE["tokenizer"](ctx)
    assert "corpus has not been materialized for profile 'smoke'" in err.value.description
    assert "Materialize corpus first (`k3 run --profile smoke --select '*corpus'`" in err.value.description


def test_each_profile_records_its_own_inputs(data_run, smoke_resources):
    """The repro of research/ux-2.md finding 1 on one instance: smoke data, then tiny corpus (and the
    other cheap tiny data), then the smoke tokenizer again. Its recorded input is the smoke corpus,
    and the smoke assets stay fresh."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    instance, _ = data_run
    tiny = data.build("tiny")
    assert dg.materialize(tiny, selection=["tiny/corpus", "tiny/tokenizer", "tiny/image_data"],
                          instance=instance, resources=smoke_resources).success
    again = dg.materialize(list(SMOKE.values()), selection=["smoke/tokenizer"], instance=instance,
                           resources=smoke_resources)
    assert again.success

    for profile in ("smoke", "tiny"):
        corpus_version = _latest(instance, profile, "corpus").tags["dagster/data_version"]
        tags = _latest(instance, profile, "tokenizer").tags
        assert tags[f"dagster/input_data_version/{profile}/corpus"] == corpus_version
        assert not any(t.startswith("dagster/input_data_version/") and f"/{profile}/" not in t for t in tags)
    assert (_latest(instance, "smoke", "corpus").tags["dagster/data_version"]
            != _latest(instance, "tiny", "corpus").tags["dagster/data_version"])
    assert instance.get_run_by_id(again.run_id).tags["k3/profile"] == "smoke"

    graph = dg.Definitions(assets=[*SMOKE.values(), *tiny], resources=smoke_resources).resolve_asset_graph()
    stale = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    for name in NAMES:
        assert stale.get_status(key("smoke", name)) == StaleStatus.FRESH, name
    assert stale.get_status(key("tiny", "clue_data")) == StaleStatus.MISSING


def test_invalid_config_value_names_the_field(home, smoke_resources):
    with pytest.raises(Exception) as err:
        dg.materialize([SMOKE["image_data"]], resources=smoke_resources, instance=dg.DagsterInstance.ephemeral(),
                       run_config={"ops": {"smoke__image_data": {"config": {"seed": -1}}}})
    assert "seed" in error_text(err.value) and "greater than or equal to 0" in error_text(err.value)
