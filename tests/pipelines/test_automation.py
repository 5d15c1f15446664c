"""Declarative automation and schedules, evaluated against an instance (no daemon needed)."""

import dagster as dg

from assets.lineage import key
from pipelines.definitions import defs
from pipelines.schedules import EVAL_INPUTS, NIGHTLY_EVALS, WEEKLY_RERUNS


def _materialized(instance, profile, name):
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key(profile, name)))


def test_base_model_follows_the_last_stage_of_its_own_profile():
    instance = dg.DagsterInstance.ephemeral()
    base, tiny_base = key("smoke", "base_model"), key("tiny", "base_model")
    first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    assert first.get_num_requested(base) == 0  # smoke/pretrain_stage_4 is missing

    _materialized(instance, "smoke", "pretrain_stage_4")
    after_stage = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    assert after_stage.get_num_requested(base) == 1
    assert after_stage.get_num_requested(tiny_base) == 0
    assert after_stage.total_requested == 1  # nothing else is automated

    _materialized(instance, "smoke", "base_model")
    settled = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=after_stage.cursor)
    assert settled.get_num_requested(base) == 0

    _materialized(instance, "smoke", "pretrain_stage_4")
    again = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=settled.cursor)
    assert again.get_num_requested(base) == 1


def test_nightly_eval_skips_a_profile_without_checkpoints():
    with dg.instance_for_test() as instance:
        skipped = NIGHTLY_EVALS["smoke"].evaluate_tick(dg.build_schedule_context(instance=instance))
        assert not skipped.run_requests and "smoke: corpus, tokenizer" in skipped.skip_message
        for name in EVAL_INPUTS:
            _materialized(instance, "smoke", name)
        nightly = NIGHTLY_EVALS["smoke"].evaluate_tick(dg.build_schedule_context(instance=instance))
        tiny = NIGHTLY_EVALS["tiny"].evaluate_tick(dg.build_schedule_context(instance=instance))
        weekly = WEEKLY_RERUNS["smoke"].evaluate_tick(dg.build_schedule_context(instance=instance))
    [request] = nightly.run_requests
    assert request.tags["k3/profile"] == "smoke" and not tiny.run_requests
    assert len(weekly.run_requests) == 1
    assert NIGHTLY_EVALS["smoke"].cron_schedule == "0 2 * * *" and WEEKLY_RERUNS["smoke"].cron_schedule == "0 3 * * 0"
