"""Sensors: the declarative-automation sensor, running by default.

Dagster's implicit automation sensor starts stopped in open-source deployments
(research/orchestration.md §1), so nothing with an `automation_condition` would ever fire. This
one evaluates every asset's condition (today: `base_model` follows `pretrain_stage_4` eagerly).
"""

import dagster as dg

automation = dg.AutomationConditionSensorDefinition(
    "k3_automation", target=dg.AssetSelection.all(), default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=60)

SENSORS = [automation]
