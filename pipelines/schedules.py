"""Schedules, per profile: re-evaluate the newest checkpoints nightly (on by default for the profile
this machine runs — K3_PROFILE, else tiny — and off for the others, which a CPU machine never
materializes; a profile with no checkpoints skips, saying why) and a weekly full rerun (off).

The weekly rerun retrains every stage — about half an hour of both cores on the tiny profile — so
it starts stopped: turn it on in the UI (Automation) or with `dagster schedule start`.
"""

import dagster as dg

from assets.lineage import PROFILE_TAG, key
from assets.pretrain import DATA_INPUTS, NUM_STAGES, stage_name
from assets.profiles import PROFILES
from pipelines.jobs import ALL_JOBS, EVAL_JOBS
from pipelines.resources import default_profile

EVAL_INPUTS = (*DATA_INPUTS, *(stage_name(s) for s in range(1, NUM_STAGES + 1)))


def _nightly_eval(profile: str) -> dg.ScheduleDefinition:
    @dg.schedule(name=f"{profile}_nightly_checkpoint_eval", job=EVAL_JOBS[profile], cron_schedule="0 2 * * *",
                 default_status=(dg.DefaultScheduleStatus.RUNNING if profile == default_profile()
                                 else dg.DefaultScheduleStatus.STOPPED),
                 description=f"02:00 every night: {profile}/checkpoint_evals re-scores the newest checkpoint "
                             "of each stage (skipped while the profile has none).")
    def _schedule(context: dg.ScheduleEvaluationContext):
        missing = [n for n in EVAL_INPUTS
                   if context.instance.get_latest_materialization_event(key(profile, n)) is None]
        if missing:
            return dg.SkipReason(f"{profile}: {', '.join(missing)} never materialized, so there is nothing "
                                 f"to re-score (`k3 run --profile {profile}` makes them)")
        return dg.RunRequest(tags={PROFILE_TAG: profile})
    return _schedule


def _weekly_full_rerun(profile: str) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name=f"{profile}_weekly_full_rerun", job=ALL_JOBS[profile], cron_schedule="0 3 * * 0",
        default_status=dg.DefaultScheduleStatus.STOPPED, tags={PROFILE_TAG: profile},
        description=f"03:00 on Sundays: every {profile} asset from the data up.")


NIGHTLY_EVALS = {p: _nightly_eval(p) for p in PROFILES}
WEEKLY_RERUNS = {p: _weekly_full_rerun(p) for p in PROFILES}
SCHEDULES = [*NIGHTLY_EVALS.values(), *WEEKLY_RERUNS.values()]
