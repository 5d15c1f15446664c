"""Sensors: one declarative-automation sensor per profile, running by default.

Dagster's implicit automation sensor starts stopped in open-source deployments
(docs/orchestration.md), so nothing with an `automation_condition` would ever fire. These evaluate
every asset's condition (today: `<profile>/base_model` follows `<profile>/pretrain_stage_4`
eagerly), one per profile so that each run they launch carries its profile as the `k3/profile` tag.

The target is the selection string `key:"<profile>/*"` (what the Lineage search box takes), so the
sensor's page shows it as such; `AssetSelection.key_prefixes` selects the same keys but has no string
form, and the UI would show its Python repr.
"""

import dagster as dg

from assets.lineage import PROFILE_TAG
from assets.profiles import PROFILES

AUTOMATION = {p: dg.AutomationConditionSensorDefinition(
    f"{p}_automation", target=dg.AssetSelection.from_string(f'key:"{p}/*"'), run_tags={PROFILE_TAG: p},
    default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=60,
    description=f"Every {p} asset (key:\"{p}/*\") whose automation condition is met: today {p}/base_model, "
                f"launched after each new {p}/pretrain_stage_4.")
    for p in PROFILES}

SENSORS = list(AUTOMATION.values())
