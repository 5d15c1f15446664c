"""Schedules: re-evaluate the newest checkpoints nightly (on by default); a weekly full rerun (off).

The weekly rerun retrains every stage — about half an hour of both cores on the tiny profile — so
it starts stopped: turn it on in the UI (Automation) or with `dagster schedule start`.
"""

import dagster as dg

from pipelines.jobs import all_job, eval_job

nightly_eval = dg.ScheduleDefinition(
    name="nightly_checkpoint_eval", job=eval_job, cron_schedule="0 2 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="02:00 every night: checkpoint_evals re-scores the newest checkpoint of each stage.")

weekly_full_rerun = dg.ScheduleDefinition(
    name="weekly_full_rerun", job=all_job, cron_schedule="0 3 * * 0",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="03:00 on Sundays: every asset from the data up.")

SCHEDULES = [nightly_eval, weekly_full_rerun]
