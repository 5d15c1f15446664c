"""kill -9 in a training stage, then the next `k3 run` or `k3 ui` cleans up (pipelines/recovery.py):
the Dagster run that stayed STARTED (and, with one run at a time, blocked the run queue for good) is
marked failed, so are its MLflow runs, partial files go, and the resumable checkpoint and every
finished asset stay."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
from mlflow.tracking import MlflowClient

from assets.lineage import key, latest, upstream_problem
from k3model.checkpoint import load_resume_state
from pipelines.definitions import defs
from pipelines.freshness import stale_assets
from pipelines.instance import dagster_home
from pipelines.recovery import ACTIVE, prepare_home

# A run of the data assets and an 8-step stage 1 (a resumable checkpoint every 2 steps), every step
# logged, in the home's instance: killed with SIGKILL by the test.
DRIVER = """
import sys
from pathlib import Path
from pipelines.instance import apply_k3_environ
apply_k3_environ("smoke", Path(sys.argv[1]))
import dagster as dg
from pipelines.definitions import defs
from assets.lineage import key
sel = dg.AssetSelection.assets(key("smoke", "pretrain_stage_1")).upstream()
job = dg.Definitions.merge(defs, dg.Definitions(jobs=[dg.define_asset_job("crash", sel)])).resolve_job_def("crash")
job.execute_in_process(instance=dg.DagsterInstance.get(), run_config={
    "ops": {"smoke__pretrain_stage_1": {"config": {"steps": 8, "log_every": 1, "eval_examples_per_cell": 1}}}})
"""
DATA = ("corpus", "tokenizer", "clue_data", "image_data")


def test_kill_9_in_a_stage_then_the_next_start_recovers(tmp_path, monkeypatch):
    home = tmp_path / "home"
    env = {**os.environ, "K3_HOME": str(home)}
    env.pop("DAGSTER_HOME", None)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(home)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, task_pid = [], None
    t0 = time.monotonic()
    for line in proc.stdout:
        lines.append(line)
        # Ray names the task after its label (pipelines.resources.run_all).
        if m := re.search(r"\(smoke/pretrain_stage_1 pid=(\d+)\).*\[smoke/pretrain_stage_1\] step 3:", line):
            task_pid = int(m.group(1))
            break
    proc.kill()
    proc.wait()
    t1 = time.monotonic()
    assert task_pid is not None, "".join(lines)[-3000:]
    # The task's watchdog ends it with its driver (generous: a shared 2-core machine).
    deadline = time.monotonic() + 60
    while Path(f"/proc/{task_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{task_pid}").exists(), "the training task outlived its driver"
    print(f"killed at {t1 - t0:.1f} s; task gone {time.monotonic() - t1:.1f} s later")

    monkeypatch.setenv("K3_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home(home)))
    instance = dg.DagsterInstance.get()
    [run] = instance.get_runs()
    assert run.status == dg.DagsterRunStatus.STARTED  # what kill -9 leaves: the queue's one slot taken
    client = MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("k3").experiment_id
    stage_run = next(r for r in client.search_runs([experiment]) if r.data.tags["asset"] == "smoke/pretrain_stage_1")
    assert stage_run.info.status == "RUNNING"
    # Beside it, its lock (pipelines.home_lock.hold_work_dir), freed by the kill.
    [work] = [p for p in (home / "work" / "smoke" / "pretrain_stage_1").iterdir() if p.is_dir()]
    # What a kill in the middle of a save, or between moving a checkpoint and recording it, leaves.
    (work / ".last.tmp-0123456789ab").mkdir()
    orphan = home / "checkpoints" / "smoke" / "pretrain_stage_1" / run.run_id
    orphan.mkdir(parents=True)

    said = []
    t2 = time.monotonic()
    prepare_home(home, "k3 run", said.append)
    print(f"prepare_home {time.monotonic() - t2:.1f} s")
    assert any(f"run {run.run_id} was STARTED but its process (pid {proc.pid}) is gone: marked failed" in s
               for s in said), said
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
    # The run queue launches when fewer runs than max_concurrent_runs (1) are in these statuses.
    assert instance.get_runs(filters=dg.RunsFilter(statuses=list(ACTIVE))) == []
    assert client.get_run(stage_run.info.run_id).info.status == "FAILED"
    assert all(r.info.status == "FINISHED" for r in client.search_runs([experiment])
               if r.data.tags["asset"] in {f"smoke/{n}" for n in DATA})
    assert not (work / ".last.tmp-0123456789ab").exists() and not orphan.exists()
    # Nothing lost: the data the run materialized verifies, and the stage resumes from step ≥ 2.
    for name in DATA:
        up = latest(instance, "smoke", name)
        assert up is not None and upstream_problem(up) is None, name
    resume = load_resume_state(work / "last")
    assert resume is not None and resume[1].step >= 2
    # The rerun redoes only the stage: what the killed run finished is up to date.
    todo = stale_assets(instance, defs.resolve_asset_graph(),
                        [key("smoke", n) for n in (*DATA, "pretrain_stage_1")], "smoke")
    assert todo == {key("smoke", "pretrain_stage_1"): "never materialized for profile 'smoke'"}
    # A second start finds nothing left to do.
    assert prepare_home(home, "k3 run", said.append) == []
