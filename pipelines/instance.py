"""The project's Dagster instance under `.k3/dagster/` and the environment the CLI runs it with.

`dagster dev`, `dagster asset materialize` and `k3 run` all use the instance that `DAGSTER_HOME`
names; pointing it at `.k3/dagster/` makes headless runs and UI runs share one history. The
instance is sqlite (Dagster's default when `dagster.yaml` names no storage) with telemetry off and at
most one run at a time: a run owns the machine (it starts its own Ray cluster), and two on two
cores would only slow each other down.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.resources import k3_home

DAGSTER_YAML = """\
# Written by `k3` (pipelines/instance.py); edit freely, it is not overwritten.
# Storage: sqlite under this directory (Dagster's default when no storage is named).
telemetry:
  enabled: false
run_queue:
  max_concurrent_runs: 1
"""


def dagster_home(home: Path | None = None) -> Path:
    """`<K3_HOME>/dagster`, created with a dagster.yaml when missing."""
    path = (home or k3_home()) / "dagster"
    path.mkdir(parents=True, exist_ok=True)
    config = path / "dagster.yaml"
    if not config.exists():
        config.write_text(DAGSTER_YAML)
    return path


def k3_environ(profile: str | None = None, home: Path | None = None) -> dict[str, str]:
    """The variables that point Dagster, MLflow and the resources at the project's home."""
    home = (home or k3_home()).resolve()
    env = {"K3_HOME": str(home), "DAGSTER_HOME": str(dagster_home(home))}
    if profile:
        env["K3_PROFILE"] = profile
    return env


def apply_k3_environ(profile: str | None = None, home: Path | None = None) -> dict[str, str]:
    env = k3_environ(profile, home)
    os.environ.update(env)
    return env
