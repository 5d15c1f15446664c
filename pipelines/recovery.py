"""Crash hygiene, run when `k3 run` or `k3 ui` starts (under the home lock, `pipelines/home_lock.py`).

A run killed with SIGKILL (or an OOM kill, a power cut) runs no handler. It leaves behind:

- its Dagster run STARTED forever. With `max_concurrent_runs: 1` the run queue counts it as the
  one run allowed, and never launches another (from the UI, the nightly schedule or the sensor);
- its MLflow runs RUNNING;
- half-written files: hidden staging directories (`.<name>.tmp-*`, `.<name>.old-*`,
  `.staging-*`) and checkpoint or report directories of assets that it never materialized.

`prepare_home` first creates the MLflow store (its schema migrations must run once, by one process:
two at once broke the store for good), then finds in-progress runs whose process is gone, marks
them failed (and their MLflow runs), and removes the partial files. A stage's resumable `work/.../last/`
checkpoint is kept: the next run with the same inputs resumes from it.

A run's process is the pid on its RUN_START event (the `k3 run` process, or the run worker a UI
launch starts), identified with its start time so that a reused pid does not count as alive. A run
that is still alive (a `dagster asset materialize` on the same home, which takes no lock) is left
alone, and so are the files then, since they may be its own.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from pipelines.driver_watch import process_start_ticks

# Runs in these statuses hold a slot of the run queue (dagster's ACTIVE_RUN_STATUSES).
ACTIVE = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)
ENDED_BADLY = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
# A run launched by a daemon that died before its worker started has no pid: after this long in
# STARTING it is taken as dead.
STARTING_GRACE_S = 120.0
_TEMP_MARKERS = (".tmp-", ".old-", ".staging-")


def mlflow_uri(home: Path) -> str:
    return f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"


def create_mlflow_store(home: Path) -> None:
    """Create the sqlite tracking store (and run its migrations) if it does not exist yet."""
    from mlflow.tracking import MlflowClient
    (home / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    MlflowClient(tracking_uri=mlflow_uri(home)).search_experiments(max_results=1)


def _boot_time() -> float | None:
    try:
        for line in open("/proc/stat"):
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    return None


def _run_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_START, limit=1).records
    if records:
        return records[0].event_log_entry.dagster_event.pid
    return None


def process_alive_since(pid: int, before: float) -> bool:
    """Whether process `pid` exists and started no later than `before` (a Unix time): a process
    started after the run cannot be the run's."""
    import os
    ticks = process_start_ticks(pid)
    if ticks is None:
        return False
    boot = _boot_time()
    if boot is None or ticks == 0:
        return True
    started = boot + ticks / os.sysconf("SC_CLK_TCK")
    # btime has a one-second resolution.
    return started <= before + 2.0


def _run_is_alive(instance: dg.DagsterInstance, run: dg.DagsterRun) -> tuple[bool, str]:
    record = instance.get_run_record_by_id(run.run_id)
    created = record.create_timestamp.timestamp() if record else time.time()
    pid = _run_pid(instance, run.run_id)
    if pid is None:
        if run.status == dg.DagsterRunStatus.STARTING and time.time() - created < STARTING_GRACE_S:
            return True, "starting"
        return False, "no process ever started it"
    if process_alive_since(pid, created):
        return True, f"pid {pid} alive"
    return False, f"its process (pid {pid}) is gone"


def fail_dead_runs(instance: dg.DagsterInstance, who: str) -> tuple[list[str], list[str]]:
    """Mark in-progress runs whose process is gone as failed; (lines to print, live run ids)."""
    lines, live = [], []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=list(ACTIVE))):
        alive, why = _run_is_alive(instance, run)
        if alive:
            live.append(run.run_id)
            continue
        instance.report_run_failed(run, message=f"Marked failed by `{who}` at start: {why} "
                                   "(killed or crashed); a stage run again resumes from its last checkpoint.")
        # Its slot of the `gpu` pool (pipelines/instance.py) would otherwise stay taken for good.
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        lines.append(f"run {run.run_id} was {run.status.value} but {why}: marked failed")
    return lines, live


def fail_orphan_mlflow_runs(instance: dg.DagsterInstance, home: Path) -> list[str]:
    """MLflow runs still RUNNING whose Dagster run has ended (or never existed here): FAILED."""
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=mlflow_uri(home))
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return []
    lines = []
    for mlrun in client.search_runs(experiments, filter_string="attributes.status = 'RUNNING'",
                                    max_results=1000):
        dagster_run_id = mlrun.data.tags.get("dagster_run_id")
        run = instance.get_run_by_id(dagster_run_id) if dagster_run_id else None
        if run is not None and run.status in (*ACTIVE, dg.DagsterRunStatus.QUEUED):
            continue
        client.set_terminated(mlrun.info.run_id, "FAILED")
        lines.append(f"MLflow run {mlrun.info.run_id} ({mlrun.data.tags.get('asset', '?')}) was RUNNING "
                     "after its Dagster run ended: marked FAILED")
    return lines


def remove_partial_files(instance: dg.DagsterInstance, home: Path) -> list[str]:
    """Staging temporaries anywhere in the stores, and the checkpoint and report directories of
    failed or cancelled runs that never materialized the asset they belong to."""
    removed: list[Path] = []
    for store in ("data", "checkpoints", "work", "reports"):
        root = home / store
        if not root.is_dir():
            continue
        # <store>/<profile>/<asset>/[<key>/]<entry>: temporaries sit at depth 3 or 4.
        for pattern in ("*/*/.*", "*/*/*/.*"):
            for path in root.glob(pattern):
                if any(m in path.name for m in _TEMP_MARKERS):
                    _remove(path)
                    removed.append(path)
    materialized: dict[str, set[str]] = {}
    for store in ("checkpoints", "reports"):
        for path in sorted((home / store).glob("*/*/*")):
            if not path.is_dir() or path.name.startswith("."):
                continue
            run = instance.get_run_by_id(path.name)
            if run is None or run.status not in ENDED_BADLY:
                continue
            if path.name not in materialized:
                records = instance.get_records_for_run(
                    path.name, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
                materialized[path.name] = {r.event_log_entry.dagster_event.asset_key.to_user_string()
                                           for r in records}
            # <store>/<profile>/<asset>/<run id> belongs to the asset key <profile>/<asset>.
            if f"{path.parent.parent.name}/{path.parent.name}" not in materialized[path.name]:
                _remove(path)
                removed.append(path)
    return [f"removed partial {p.relative_to(home)}" for p in removed]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def prepare_home(home: Path, who: str, say: Callable[[str], None] = print) -> list[str]:
    """Create the MLflow store, then clean up after crashed runs; returns what was done (also said).

    Call it holding the home lock; DAGSTER_HOME must point at the home's instance."""
    home = Path(home)
    create_mlflow_store(home)
    instance = dg.DagsterInstance.get()
    lines, live = fail_dead_runs(instance, who)
    lines += fail_orphan_mlflow_runs(instance, home)
    if live:
        lines.append(f"run(s) {', '.join(live)} are still in progress in another process: partial files "
                     "left in place")
    else:
        lines += remove_partial_files(instance, home)
    for line in lines:
        say(f"{who}: {line}")
    return lines
