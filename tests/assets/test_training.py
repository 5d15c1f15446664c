"""The training adapter (assets/training.py) on real Ray, MLflow and Dagster, with a small training
callable in place of a trainer: concurrent partitions, a flaky task retried with its error in the
Dagster run log, a failing partition that leaves the others' checkpoints promoted and registered,
and its own staging untouched."""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import torch
from mlflow.tracking import MlflowClient

from assets.lineage import Upstream
from assets.training import TrainingJob, partition_materialization, partitioned_result, run_trainings
from k3model.checkpoint import save_checkpoint, verify_checkpoint
from pipelines.resources import partition_path, resources_for

PARTS = dg.StaticPartitionsDefinition(["ok", "flaky", "broken"])


@dataclass(frozen=True)
class ToyConfig:
    seed: int


@dataclass
class ToyResult:
    checkpoint_dir: Path
    history: list


def toy_train(cfg: ToyConfig, fail_first: int, attempts_dir: str, work_dir: str, live) -> ToyResult:
    """Fails its first `fail_first` attempts (counted in `attempts_dir`, which survives retries), then
    writes a checkpoint of a seeded linear layer into its work dir."""
    attempts = Path(attempts_dir)
    attempts.mkdir(parents=True, exist_ok=True)
    n = len(list(attempts.iterdir()))
    (attempts / f"attempt-{n}").touch()
    # Something in the staging directory, as a trainer's resumable state would be.
    (Path(work_dir) / "last").mkdir(exist_ok=True)
    if n < fail_first:
        raise RuntimeError(f"toy failure {n + 1} of seed {cfg.seed}")
    history = [{"step": s, "train/main": 2.0 / s} for s in (1, 2, 3)]
    for h in history:
        if h["step"] % 2 == 0 or h["step"] == 3:  # a trainer's log_every = 2, and its last step
            live(h["step"], h)
    torch.manual_seed(cfg.seed)
    info = save_checkpoint(Path(work_dir) / "final", torch.nn.Linear(3, 2).state_dict(), {"config": {"seed": cfg.seed}})
    return ToyResult(info.path, history)


FAIL_FIRST = {"ok": 0, "flaky": 1, "broken": 99}
SEEDS = {"ok": 1, "flaky": 2, "broken": 3}


@dg.asset(name="toy", key_prefix=["smoke"], partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run(),
          required_resource_keys={"store", "mlflow", "ray"})
def toy(context: dg.AssetExecutionContext):
    attempts_root = Path(context.resources.store.resolved_root()) / "attempts"
    jobs = [TrainingJob(profile="smoke", name="toy", partition=p, task=toy_train,
                        args=(ToyConfig(SEEDS[p]), FAIL_FIRST[p], str(attempts_root / p)), config=ToyConfig(SEEDS[p]),
                        inputs={"up": Upstream("up", Path("/dev/null"), "v1", "r", {})}, description=f"toy {p}",
                        log_every=2, num_cpus=1, retries=1,
                        headline=lambda r: {"train/final": r.history[-1]["train/main"]})
            for p in context.partition_keys]
    recorded = set()

    def record(trained):
        # As each partition finishes, while the others still run.
        p = trained.job.partition
        context.log_event(partition_materialization(context, "smoke", p, trained.metadata({"seed": SEEDS[p]}),
                                                    trained.info.sha256, "toy-1"))
        recorded.add(p)

    outcomes = dict(zip(context.partition_keys, run_trainings(context, jobs, on_trained=record)))
    yield from partitioned_result(
        context, "smoke", {p: (o.metadata({"seed": SEEDS[p]}), o.info.sha256) for p, o in outcomes.items()
                           if not isinstance(o, BaseException)},
        {p: o for p, o in outcomes.items() if isinstance(o, BaseException)}, frozenset(recorded), "toy-1")


@pytest.fixture(scope="module")
def ray_cluster():
    import ray
    from ray import cloudpickle
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # The workers unpickle toy_train by value: this test module is not importable there.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, object_store_memory=128 << 20)
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    if started:
        ray.shutdown()


def test_partitions_train_concurrently_a_failure_is_retried_and_isolated(tmp_path, ray_cluster):
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([toy], instance=instance, resources=resources_for(tmp_path), raise_on_error=False,
                            tags={"dagster/asset_partition_range_start": "ok", "dagster/asset_partition_range_end": "broken"})
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.event_specific_data.error.cause.message if failure.event_specific_data.error.cause else ""
    text = failure.event_specific_data.error.message + message
    assert "1 of 3 partition(s) failed (broken:" in text and "toy failure 2 of seed 3" in text
    assert "ok, flaky succeeded and are recorded" in text

    # The retries and the final failure are in the run's log, as warnings.
    logs = [e.user_message for e in instance.all_logs(result.run_id) if e.level >= 30]
    assert any("smoke/toy[flaky]: attempt 1 of 2 failed, retrying" in m and "toy failure 1 of seed 2" in m for m in logs)
    assert any("smoke/toy[broken]: failed after 2 attempt(s)" in m for m in logs)
    # Progress lines of the tasks reached the event feed.
    assert any("[smoke/toy[ok]] step 2" in e.user_message for e in instance.all_logs(result.run_id))

    # The two good partitions: promoted, verified, registered, their own metadata on their own event.
    # Each recorded once, when its task finished (before the step failed on the broken one).
    events = [e for e in instance.all_logs(result.run_id) if e.dagster_event and e.dagster_event.is_step_materialization]
    mats = {e.dagster_event.event_specific_data.materialization.partition: e.dagster_event.event_specific_data.materialization
            for e in events}
    assert sorted(mats) == ["flaky", "ok"] and len(events) == 2
    assert all(m.tags["dagster/code_version"] == "toy-1" for m in mats.values())
    client = MlflowClient(f"sqlite:///{tmp_path.resolve() / 'mlflow' / 'mlflow.db'}")
    for p in ("ok", "flaky"):
        md = mats[p].metadata
        path = Path(md["path"].value)
        assert path.parent == tmp_path.resolve() / "checkpoints" / "smoke" / "toy" / p
        assert verify_checkpoint(path).sha256 == md["sha256"].value == mats[p].tags["dagster/data_version"]
        assert md["seed"].value == SEEDS[p] and md["partition"].value == p
        assert md["model_version"].value == f"k3-smoke-toy-{p}/1"
        # Where it ran (issue 42 item 5): Ray's CPU share, no GPU on this machine.
        assert md["device"].value == "cpu" and md["gpu"].value == "none"
        assert set(md["ray_resources"].data) == {"CPU"} and md["node"].value
        [version] = client.search_model_versions(f"name = 'k3-smoke-toy-{p}'")
        assert version.tags["partition"] == p and version.tags["train/final"] == "0.6667"
        # History: steps 2 were logged live, 1 and 3 afterwards; every step is there once.
        run_id = md["mlflow_run"].value.rsplit("/", 1)[1]
        assert sorted(m.step for m in client.get_metric_history(run_id, "train/main")) == [1, 2, 3]
        assert client.get_run(run_id).info.status == "FINISHED"
        assert client.get_run(run_id).data.tags["partition"] == p
    assert mats["ok"].metadata["sha256"].value != mats["flaky"].metadata["sha256"].value

    # The broken one: MLflow run FAILED, nothing promoted, its staging (resumable state) kept.
    runs = client.search_runs([client.get_experiment_by_name("k3").experiment_id],
                              filter_string="tags.partition = 'broken'")
    assert [r.info.status for r in runs] == ["FAILED"]
    assert not (tmp_path / "checkpoints" / "smoke" / "toy" / "broken").exists()
    # (A stage's work-dir lock is a hidden file beside its directory.)
    [staging] = [p for p in (tmp_path / "work" / "smoke" / "toy" / partition_path("broken")).iterdir()
                 if not p.name.startswith(".")]
    assert (staging / "last").is_dir()
    assert instance.get_latest_materialization_event(dg.AssetKey(["smoke", "toy"])) is not None


def test_counts_and_grid_cells_are_not_charted():
    from assets.ray_task import charted
    # MLflow's chart view opens on the curves: the n behind a rate and the grid's cells stay out.
    assert charted("train/main") and charted("eval/clue_acc/scattered/all") and charted("eval/ppl")
    assert not charted("eval/clue_n/scattered/d0-32") and not charted("eval/clue_n/control/all")
    assert not charted("eval/clue_acc/scattered/len64/d0-32")
