"""Sensors: one declarative-automation sensor per profile, running by default.

Dagster's implicit automation sensor starts stopped in open-source deployments
(docs/orchestration.md), so nothing with an `automation_condition` would ever fire. These evaluate
every asset's condition (today: `<profile>/base_model` follows `<profile>/pretrain_stage_4`
eagerly), one per profile so that each run they launch carries its profile as the `k3/profile` tag.
"""

import dagster as dg

from assets.lineage import PROFILE_TAG
from assets.profiles import PROFILES

AUTOMATION = {p: dg.AutomationConditionSensorDefinition(
    f"{p}_automation", target=dg.AssetSelection.key_prefixes([p]), run_tags={PROFILE_TAG: p},
    default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=60,
    description=f"Launches the {p} assets whose automation condition is met (base_model after stage 4).")
    for p in PROFILES}

SENSORS = list(AUTOMATION.values())
