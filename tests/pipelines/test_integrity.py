"""Data verified on read (assets/lineage.py, verify_upstreams), re-materializing replaces damaged files
(assets/storage.py), and `k3 run`'s missing/stale selection (pipelines/freshness.py): flipped bytes
in each data file and in a checkpoint."""

import dagster as dg
import pytest
import torch

from assets import data, pretrain
from assets.lineage import PROFILE_TAG, key, latest
from assets.pretrain import PretrainStageConfig
from k3model.checkpoint import WEIGHTS_FILE, save_checkpoint, sha256_file
from pipelines.definitions import defs
from pipelines.freshness import stale_assets
from pipelines.resources import resources_for

DATA_ASSETS = data.build("smoke")
corpus, tokenizer, clue_data, image_data = DATA_ASSETS
STAGE_ASSETS = pretrain.build("smoke")[0][:4]
DATA = [a.key.path[-1] for a in DATA_ASSETS]


@pytest.fixture(scope="module")
def materialized(tmp_path_factory):
    resources = resources_for(tmp_path_factory.mktemp("home"))
    instance = dg.DagsterInstance.ephemeral()
    assert dg.materialize(DATA_ASSETS, instance=instance, resources=resources).success
    return instance, resources


def _flip(path, n=256):
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + n] = bytes(b ^ 0xA5 for b in raw[mid:mid + n])
    path.write_bytes(bytes(raw))


def _stale(instance, names=DATA):
    """{name: why} of the smoke assets `names` that a `k3 run` would materialize."""
    todo = stale_assets(instance, defs.resolve_asset_graph(), [key("smoke", n) for n in names], "smoke")
    return {k.path[-1]: why for k, why in todo.items()}


# (damaged asset, a consumer that reads it, the assets a rerun then has to redo)
CASES = [(corpus, lambda ctx: tokenizer(ctx), {"corpus", "tokenizer", "clue_data"}),
         (tokenizer, lambda ctx: clue_data(ctx), {"tokenizer", "clue_data"}),
         (clue_data, lambda ctx: STAGE_ASSETS[0](ctx, PretrainStageConfig()), {"clue_data"}),
         (image_data, lambda ctx: STAGE_ASSETS[0](ctx, PretrainStageConfig()), {"image_data"})]


@pytest.mark.parametrize("damaged, consumer, redo", CASES, ids=[c[0].key.path[-1] for c in CASES])
def test_flipped_bytes_in_a_data_file_are_refused_then_replaced(materialized, damaged, consumer, redo):
    instance, resources = materialized
    name = damaged.key.path[-1]
    assert _stale(instance) == {}
    up = latest(instance, "smoke", name)
    _flip(up.path)

    with dg.build_asset_context(resources=resources, instance=instance) as ctx, pytest.raises(dg.Failure) as err:
        consumer(ctx)
    msg = err.value.description
    assert f"{name}: file {up.path} is damaged" in msg and up.data_version in msg, msg
    assert f"--select {name}`" in msg
    todo = _stale(instance)
    assert set(todo) == redo and "is damaged" in todo[name], todo

    # Re-materializing writes the same content address and must replace the damaged file.
    assert dg.materialize([damaged], instance=instance, resources=resources).success
    assert sha256_file(up.path) == up.data_version
    assert _stale(instance) == {}


def test_an_upstream_that_is_no_file_is_named(materialized, tmp_path):
    _, resources = materialized
    instance = dg.DagsterInstance.ephemeral()
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key=key("smoke", "corpus"), metadata={"path": dg.MetadataValue.path(str(tmp_path))}, tags={PROFILE_TAG: "smoke"}))
    with dg.build_asset_context(resources=resources, instance=instance) as ctx, \
            pytest.raises(dg.Failure, match=f"cannot start from corpus: checkpoint {tmp_path} has no manifest"):
        tokenizer(ctx)


def test_a_checkpoint_with_flipped_bytes_or_swapped_for_another(materialized, tmp_path):
    instance, resources = materialized
    torch.manual_seed(0)
    good = save_checkpoint(tmp_path / "a", torch.nn.Linear(4, 3).state_dict())
    other = save_checkpoint(tmp_path / "b", torch.nn.Linear(4, 3).state_dict())

    def report(path):
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key("smoke", "pretrain_stage_1"), metadata={"path": dg.MetadataValue.path(str(path))},
            tags={PROFILE_TAG: "smoke", "dagster/data_version": good.sha256}))

    def refusal():
        with dg.build_asset_context(resources=resources, instance=instance) as ctx, pytest.raises(dg.Failure) as err:
            STAGE_ASSETS[1](ctx, PretrainStageConfig())
        return err.value.description

    report(good.path)
    assert _stale(instance) == {}  # the data are intact
    # A valid checkpoint, but not the one recorded.
    report(other.path)
    assert f"checkpoint {other.path} is damaged: its sha256 is {other.sha256} but its materialization" in refusal()
    report(good.path)
    _flip(good.path / WEIGHTS_FILE, 16)
    assert f"checkpoint file {good.path / WEIGHTS_FILE} is corrupted" in refusal()
    todo = _stale(instance, ["pretrain_stage_1"])
    assert "is corrupted" in todo["pretrain_stage_1"]


def test_lr_inf_fails_the_stage_before_it_trains(materialized):
    instance, resources = materialized
    # The asset config refuses it when built (assets/config_bounds.py), before any asset body runs.
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="lr must be a finite number, got inf"):
        PretrainStageConfig(lr=float("inf"))
