"""The pipeline's Definitions: only assembled here (assets/, and pipelines/{jobs,schedules,sensors,resources}.py)."""

import dagster as dg

from assets.data import DATA_ASSETS
from assets.evaluation import checkpoint_evals
from assets.pretrain import PRETRAIN_CHECKS, STAGE_ASSETS, base_model
from pipelines.jobs import JOBS
from pipelines.resources import RESOURCES
from pipelines.schedules import SCHEDULES
from pipelines.sensors import SENSORS

defs = dg.Definitions(
    assets=[*DATA_ASSETS, *STAGE_ASSETS, base_model, checkpoint_evals],
    asset_checks=PRETRAIN_CHECKS,
    jobs=JOBS, schedules=SCHEDULES, sensors=SENSORS, resources=RESOURCES,
    # One process per run, so a run starts its Ray cluster once rather than once per step.
    executor=dg.in_process_executor,
)
