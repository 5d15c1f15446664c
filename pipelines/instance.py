"""The project's Dagster instance under `.k3/dagster/` and the environment the CLI runs it with.

`dagster dev`, `dagster asset materialize` and `k3 run` all use the instance that `DAGSTER_HOME`
names; pointing it at `.k3/dagster/` makes headless runs and UI runs share one history. The
instance is sqlite (Dagster's default when `dagster.yaml` names no storage) with telemetry off.

Runs do not serialize: up to four queued runs (the UI's) run at once, and every step that runs a
model on Ray (`@asset(pool="gpu")`: pretraining, evaluation, post-training, deploy) takes the one
slot of the `gpu` pool, so GPU steps queue across runs, `k3 run`'s included, while data steps and
the UI go on. Run monitoring fails a run whose process never started or died (the UI's runs; `k3
run` also checks pids itself, pipelines/recovery.py). A home created before keeps its own
dagster.yaml (the file is never overwritten): delete it to get this one.
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
concurrency:
  runs:
    max_concurrent_runs: 4
  pools:
    # The `gpu` pool (the only pool): one model step at a time across runs; Ray packs the tasks
    # of that step (the nine specialists) onto the GPUs itself.
    granularity: op
    default_limit: 1
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  cancel_timeout_seconds: 180
  poll_interval_seconds: 30
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
