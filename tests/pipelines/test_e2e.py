"""End to end through Dagster's own command line: `dagster asset materialize` of the data and
pretraining groups on the smoke profile, with real Ray (the run joins this module's cluster through
RAY_ADDRESS) and a real sqlite MLflow store, everything under a temporary directory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from assets.lineage import INLINE_MARKDOWN_CHARS
from assets.lineage import key as asset_key
from k3model.checkpoint import WEIGHTS_FILE, sha256_file, verify_checkpoint
from pipelines.instance import dagster_home

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).parent / "dagster")
DATA = ["corpus", "tokenizer", "clue_data", "image_data"]
STAGES = [f"pretrain_stage_{s}" for s in range(1, 5)]
# The smoke profile's own steps, every step logged; one clue example per (length, distance) cell.
SHORT = {"eval_examples_per_cell": 1, "log_every": 1}


@pytest.fixture(scope="module")
def ray_address():
    import ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=os.cpu_count(), num_gpus=0, include_dashboard=False, object_store_memory=256 << 20)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _materialize(home: Path, select: list[str], ray_address: str, ops: dict | None = None):
    # Asset keys and op names carry the profile: smoke/pretrain_stage_1 is the op smoke__pretrain_stage_1.
    select = [f"smoke/{n}" for n in select]
    config = {"ops": {f"smoke__{n}": c for n, c in (ops or {}).items()}}
    env = {**os.environ, "K3_HOME": str(home), "DAGSTER_HOME": str(dagster_home(home)),
           "RAY_ADDRESS": ray_address, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([DAGSTER, "asset", "materialize", "-m", "pipelines.definitions",
                           "--select", ",".join(select), "--config-json", json.dumps(config)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)


@pytest.mark.e2e
@pytest.mark.slow
def test_smoke_graph_through_the_dagster_cli(tmp_path, ray_address):
    home = tmp_path / "home"
    proc = _materialize(home, [*DATA, *STAGES, "base_model"], ray_address,
                        ops={s: {"config": SHORT} for s in STAGES})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]

    os.environ["DAGSTER_HOME"] = str(dagster_home(home))
    try:
        instance = dg.DagsterInstance.get()
        latest = {n: instance.get_latest_materialization_event(asset_key("smoke", n)).asset_materialization
                  for n in [*DATA, *STAGES, "base_model"]}
        run_ids = {instance.get_latest_materialization_event(asset_key("smoke", n)).run_id for n in latest}
        checks = [r for r in instance.get_records_for_run(next(iter(run_ids)),
                                                          of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records]
    finally:
        del os.environ["DAGSTER_HOME"]
    assert len(run_ids) == 1  # one run: one Ray driver, one cluster

    # Data versions are content hashes; every checkpoint records the data it was trained on.
    for name in DATA:
        md = latest[name].metadata
        assert latest[name].tags["dagster/data_version"] == sha256_file(md["path"].value)
    data_hashes = {sha256_file(latest[n].metadata["path"].value) for n in DATA}
    for name in [*STAGES, "base_model"]:
        info = verify_checkpoint(latest[name].metadata["path"].value)
        assert latest[name].tags["dagster/data_version"] == info.sha256
        assert set(info.manifest["data_versions"].values()) == data_hashes
    assert latest["base_model"].tags["dagster/data_version"] == latest["pretrain_stage_4"].tags["dagster/data_version"]
    stage4 = json.loads((Path(latest["pretrain_stage_4"].metadata["path"].value) / "manifest.json").read_text())
    assert stage4["config"]["pretrain"]["stage"] == 4

    evaluations = {(e.event_log_entry.dagster_event.event_specific_data.asset_key.path[-1],
                    e.event_log_entry.dagster_event.event_specific_data.check_name):
                   e.event_log_entry.dagster_event.event_specific_data.passed for e in checks}
    for name in [*STAGES, "base_model"]:
        assert evaluations[(name, "checkpoint_intact")] is True

    # What a stage reports (issue part 3).
    md = {k: v.value for k, v in latest["pretrain_stage_1"].metadata.items()}
    for key in ("eval/ppl", "eval/vqa_acc", "moe/load_max_over_mean", "perf/tokens_per_s", "perf/wall_s",
                "train/first_loss", "train/final_loss"):
        assert isinstance(md[key], float), key
    assert "| distance | scattered | control |" in md["clue_acc_by_distance"]
    assert "| length | scattered | control |" in md["clue_acc_by_length"]
    assert "| step | train/main | lr |" in md["loss_curve"]
    # Pictures in the metadata: the full plot (behind "[Show Markdown]") and a sparkline short
    # enough to show in the table itself.
    assert md["loss_plot"].startswith("![loss curve of smoke/pretrain_stage_1](data:image/png;base64,")
    assert md["loss"].startswith("![train/main](data:image/png;base64,") and len(md["loss"]) < INLINE_MARKDOWN_CHARS
    assert {(s, "loss_fell") for s in STAGES} <= set(evaluations)

    # One MLflow run per asset, all tagged with the one Dagster run.
    client = MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("k3").experiment_id])
    assert sorted(r.data.tags["asset"] for r in runs) == sorted(f"smoke/{n}" for n in [*DATA, *STAGES, "base_model"])
    assert {r.data.tags["dagster_run_id"] for r in runs} == run_ids
    assert all(r.info.status == "FINISHED" for r in runs)
    stage1 = next(r for r in runs if r.data.tags["asset"] == "smoke/pretrain_stage_1")
    assert md["mlflow_run"].endswith(stage1.info.run_id)
    # Every step, logged live from inside the Ray task (log_every 1 here).
    assert [m.step for m in client.get_metric_history(stage1.info.run_id, "train/main")] == list(range(1, md["steps"] + 1))
    # The clue grid is one table artifact, not a metric per cell; the checkpoint is not copied.
    assert {a.path for a in client.list_artifacts(stage1.info.run_id)} == {"eval", "loss.png"}
    assert not any(k.startswith("eval/clue_acc/") and not k.endswith("/all") for k in stage1.data.metrics)
    for s in STAGES:
        [version] = client.search_model_versions(f"name = 'k3-smoke-{s}'")
        assert version.tags["sha256"] == latest[s].tags["dagster/data_version"]
        assert version.source == Path(latest[s].metadata["path"].value).relative_to(home.resolve()).as_posix()
    champion = client.get_model_version_by_alias("k3-smoke-base", "champion")
    assert champion.tags["sha256"] == latest["base_model"].tags["dagster/data_version"]
    assert champion.tags["profile"] == "smoke" and "eval/ppl" in champion.tags

    # The nightly re-evaluation, cut to one stage and one clue example per cell.
    proc = _materialize(home, ["checkpoint_evals"], ray_address,
                        ops={"checkpoint_evals": {"config": {"examples_per_cell": 1, "stages": [1]}}})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    os.environ["DAGSTER_HOME"] = str(dagster_home(home))
    try:
        evals = dg.DagsterInstance.get().get_latest_materialization_event(
            asset_key("smoke", "checkpoint_evals")).asset_materialization.metadata
    finally:
        del os.environ["DAGSTER_HOME"]
    assert "| stage | sha256 | ppl | vqa |" in evals["clue_acc_by_distance"].value
    assert evals["evals"].value["pretrain_stage_1"]["eval/ppl"] == pytest.approx(md["eval"]["eval/ppl"], rel=1e-4)

    # A corrupted stage-4 checkpoint: base_model refuses it with the file and both hashes, exit 1.
    weights = Path(latest["pretrain_stage_4"].metadata["path"].value) / WEIGHTS_FILE
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF
    weights.write_bytes(bytes(raw))
    proc = _materialize(home, ["base_model"], ray_address)
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "cannot start from pretrain_stage_4" in out and f"{weights} is corrupted" in out
