"""The pipeline's Definitions: only assembled here (assets/profiles.py builds every asset once per
profile; pipelines/{jobs,schedules,sensors,resources}.py), with the edges a longer path implies
left out (assets/lineage.py, `without_implied_deps`)."""

import dagster as dg

from assets.lineage import without_implied_deps
from assets.profiles import build_all
from pipelines.jobs import JOBS
from pipelines.resources import RESOURCES
from pipelines.schedules import SCHEDULES
from pipelines.sensors import SENSORS

PROFILE_DEFS = build_all()

defs = dg.Definitions(
    assets=without_implied_deps([a for p in PROFILE_DEFS.values() for a in p.assets]),
    asset_checks=[c for p in PROFILE_DEFS.values() for c in p.checks],
    jobs=JOBS, schedules=SCHEDULES, sensors=SENSORS, resources=RESOURCES,
    # One process per run, so a run starts its Ray cluster once rather than once per step.
    executor=dg.in_process_executor,
)
