"""Declarative automation and schedules, evaluated against an instance (no daemon needed)."""

import dagster as dg

from pipelines.definitions import defs
from pipelines.schedules import nightly_eval, weekly_full_rerun


def _materialized(instance, name):
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=name, tags={"k3/profile": "smoke"}))


def test_base_model_follows_the_last_stage():
    instance = dg.DagsterInstance.ephemeral()
    base = dg.AssetKey("base_model")
    first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    assert first.get_num_requested(base) == 0  # pretrain_stage_4 is missing

    _materialized(instance, "pretrain_stage_4")
    after_stage = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    assert after_stage.get_num_requested(base) == 1
    assert after_stage.total_requested == 1  # nothing else is automated

    _materialized(instance, "base_model")
    settled = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=after_stage.cursor)
    assert settled.get_num_requested(base) == 0

    _materialized(instance, "pretrain_stage_4")
    again = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=settled.cursor)
    assert again.get_num_requested(base) == 1


def test_schedules_request_their_jobs():
    with dg.instance_for_test() as instance:
        nightly = nightly_eval.evaluate_tick(dg.build_schedule_context(instance=instance))
        weekly = weekly_full_rerun.evaluate_tick(dg.build_schedule_context(instance=instance))
    assert len(nightly.run_requests) == 1 and len(weekly.run_requests) == 1
    assert nightly_eval.cron_schedule == "0 2 * * *" and weekly_full_rerun.cron_schedule == "0 3 * * 0"
