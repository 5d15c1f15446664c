"""Post-training assets: the SFT data on the smoke tokenizer, and bad input (a missing base model,
an unknown domain, effort or partition). Real training (SFT, the ladder, the nine specialists on
Ray) runs end to end in tests/pipelines/test_e2e.py."""

import dagster as dg
import pytest

from assets import posttrain
from assets.posttrain import SPECIALIST_PARTITIONS, SFTDataAssetConfig, SFTPolicyConfig, specialist_cell
from k3model.train.effort import check_route
from datagen.io import read_parquet
from pipelines.jobs import partition_range_tags

ASSETS = {a.key.path[-1]: a for a in posttrain.build("smoke")}


def test_sft_data_covers_every_domain_and_effort_and_is_deterministic(data_run, smoke_resources):
    instance, _ = data_run
    with dg.build_asset_context(resources=smoke_resources, instance=instance) as ctx:
        first = ASSETS["sft_data"](ctx, SFTDataAssetConfig())
    with dg.build_asset_context(resources=smoke_resources, instance=instance) as ctx:
        again = ASSETS["sft_data"](ctx, SFTDataAssetConfig())
    assert first.data_version == again.data_version  # same seed, same bytes
    md = first.metadata
    table = read_parquet(md["path"].value)
    cells = set(zip(table.column("domain").to_pylist(), table.column("effort").to_pylist()))
    assert cells == {(d, e) for d in posttrain.DOMAINS for e in posttrain.EFFORTS}
    assert "openclaw" not in table.column("harness").to_pylist() and md["held_out_harness"] == "openclaw"
    heldout = read_parquet(md["heldout_path"].value)
    # The held-out demonstrations are other tasks than the training ones.
    assert not set(heldout.column("task_id").to_pylist()) & set(table.column("task_id").to_pylist())
    assert heldout.num_rows == md["heldout_rows"] > 0
    # Loss only on the model's own tokens; max thinks more than low.
    by_effort = {e: [n for n, ee in zip(table.column("n_think_tokens").to_pylist(), table.column("effort").to_pylist())
                     if ee == e] for e in posttrain.EFFORTS}
    assert sum(by_effort["low"]) == 0 < sum(by_effort["high"]) < sum(by_effort["max"])


def test_sft_without_a_base_model_names_it(smoke_resources):
    with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
            pytest.raises(dg.Failure) as err:
        ASSETS["sft_policy"](ctx, SFTPolicyConfig())
    msg = err.value.description
    assert msg.startswith("sft_policy cannot run: base_model, sft_data, tokenizer have not been materialized "
                          "for profile 'smoke'")
    assert "Materialize base_model, sft_data, tokenizer first" in msg and "--select '*base_model," in msg


def test_unknown_domain_effort_or_partition_key():
    with pytest.raises(ValueError, match="unknown domain 'coding': choose one of general_tasks, general_agents, "
                                         "coding_agents"):
        check_route("coding", "low")
    with pytest.raises(ValueError, match="unknown effort 'medium': choose one of low, high, max"):
        specialist_cell("coding_agents|medium")
    with pytest.raises(ValueError, match=r"partition key 'coding_agents' does not exist: rl_specialist's keys are "
                                         r"<domain>\|<effort>, one of general_tasks\|low, "):
        specialist_cell("coding_agents")
    assert specialist_cell("general_agents|max") == ("general_agents", "max")
    with pytest.raises(ValueError, match=r"partition\(s\) coding_agents\|huge do not exist: the partitions are "
                                         r"general_tasks\|low"):
        partition_range_tags(SPECIALIST_PARTITIONS, ["general_tasks|low", "coding_agents|huge"])


def test_a_specialist_run_refuses_a_partition_that_does_not_exist(smoke_resources):
    with pytest.raises(dg.DagsterUnknownPartitionError, match="coding_agents|huge"):
        dg.materialize([ASSETS["rl_specialist"]], partition_key="coding_agents|huge", resources=smoke_resources,
                       instance=dg.DagsterInstance.ephemeral())


def test_a_partition_range_is_the_rectangle_covering_the_partitions():
    assert partition_range_tags(SPECIALIST_PARTITIONS) == {
        "dagster/asset_partition_range_start": "general_tasks|low",
        "dagster/asset_partition_range_end": "coding_agents|max"}
    # Two cells in different rows and columns: the 2 × 2 block around them.
    tags = partition_range_tags(SPECIALIST_PARTITIONS, ["general_agents|max", "general_tasks|high"])
    assert tags == {"dagster/asset_partition_range_start": "general_tasks|high",
                    "dagster/asset_partition_range_end": "general_agents|max"}
    keys = SPECIALIST_PARTITIONS.get_partition_keys_in_range(
        dg.PartitionKeyRange(tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]))
    assert sorted(keys) == sorted(["general_tasks|high", "general_tasks|max", "general_agents|high",
                                   "general_agents|max"])
