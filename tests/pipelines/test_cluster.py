"""The cluster path on loopback: a two-node Ray cluster started with `ray start` (a 1-CPU head and a
2-CPU worker, so a task sized from the largest node fits only the worker), joined through
RAY_ADDRESS with the code shipped as a runtime_env working_dir, and an `mlflow server` holding the
tracking store and the model registry. Every Ray and MLflow process a test starts carries its
home in K3_HOME and is ended by that (`end_leftover_ray_processes`), never by `ray stop`, which
would end every Ray cluster on the machine."""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipelines.instance import dagster_home
from pipelines.resources import end_leftover_ray_processes
from tests.pipelines.services import BIN, clean_env, free_port, mlflow_server_at

REPO = Path(__file__).resolve().parents[2]
DATA = ["corpus", "tokenizer", "clue_data", "image_data"]
STAGES = [f"pretrain_stage_{s}" for s in range(1, 5)]
SHORT = {"eval_examples_per_cell": 1, "log_every": 1}


def ray_node(env: dict, temp_dir: str, cpus: int, head_port: int, head: bool) -> None:
    ports = ["--node-manager-port", "--object-manager-port", "--runtime-env-agent-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port"]
    args = [str(BIN / "ray"), "start", f"--num-cpus={cpus}", "--num-gpus=0", "--object-store-memory=100000000",
            "--node-ip-address=127.0.0.1", "--disable-usage-stats", f"--temp-dir={temp_dir}",
            *[f"{p}={free_port()}" for p in ports]]
    args += ([f"--port={head_port}", "--head", "--include-dashboard=false"] if head
             else [f"--address=127.0.0.1:{head_port}"])
    out = subprocess.run(args, cwd="/", env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


@pytest.fixture
def two_nodes(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(home)
    temp_dir = tempfile.mkdtemp(prefix="k3r", dir="/tmp")  # short: Ray's socket paths must fit 107 chars
    port = free_port()
    t0 = time.perf_counter()
    try:
        ray_node(env, temp_dir, 1, port, head=True)
        ray_node(env, temp_dir, 2, port, head=False)
        yield home, f"127.0.0.1:{port}", time.perf_counter() - t0
    finally:
        end_leftover_ray_processes(str(home))


@pytest.mark.e2e
@pytest.mark.slow
def test_two_node_cluster_ships_the_code_and_materializes_data_and_pretraining(two_nodes, tmp_path):
    home, address, start_s = two_nodes
    env = {**clean_env(home), "RAY_ADDRESS": address, "DAGSTER_HOME": str(dagster_home(home))}

    # The workers import this repository's code from the shipped working_dir (not the editable
    # install), and the two nodes are there with their own CPU counts.
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert sorted(seen["cpus"]) == [1.0, 2.0] and seen["gpus"] == 0
    assert "runtime_resources" in seen["tasks_file"] and not seen["tasks_file"].startswith(str(REPO))

    # The data and pretraining groups, through Dagster's CLI, joined to the cluster: each stage's
    # task asks for the largest node's 2 CPUs, so only the worker node can run it.
    t0 = time.perf_counter()
    select = [f"smoke/{n}" for n in [*DATA, *STAGES, "base_model"]]
    config = {"ops": {f"smoke__{s}": {"config": SHORT} for s in STAGES}}
    proc = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-m", "pipelines.definitions",
                           "--select", ",".join(select), "--config-json", json.dumps(config)],
                          cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    wall_s = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    log = proc.stdout + proc.stderr
    assert f"joined Ray cluster at {address}" in log and "runtime_env working_dir" in log
    for stage in STAGES:
        assert len(list((home / "checkpoints" / "smoke" / stage).glob("*/model.safetensors"))) == 1, stage

    # Each stage's MLflow run has the system metrics of the node its task ran on.
    from mlflow.tracking import MlflowClient
    uri = f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(uri)
    [stage_run] = client.search_runs([client.get_experiment_by_name("k3").experiment_id],
                                     "tags.asset = 'smoke/pretrain_stage_1'")
    assert any(k.startswith("system/") and "cpu_utilization_percentage" in k for k in stage_run.data.metrics), \
        sorted(stage_run.data.metrics)
    # The promoted base model loads as a pyfunc model in a fresh process and generates.
    from tests.pipelines.test_registry import fresh_env, load_in_fresh_process
    got = load_in_fresh_process(uri, "models:/k3-smoke-base@champion", fresh_env(), tmp_path)
    assert len(got["gen"][0]) == 5 and len(got["score"]) == 3
    print(f"two-node cluster: start {start_s:.1f} s, data + pretraining + base_model {wall_s:.1f} s")


PROBE = """
import json, ray
from pipelines.resources import RayResource
r = RayResource()
r._ensure()

def where():
    import assets.ray_task
    return assets.ray_task.__file__

f = ray.remote(num_cpus=2)(where)
nodes = r.nodes()
print(json.dumps({"cpus": [n.get("CPU") for n in nodes], "gpus": sum(n.get("GPU", 0) for n in nodes),
                  "tasks_file": ray.get(f.remote())}))
ray.shutdown()
"""


def test_an_unreachable_ray_address_fails_fast_and_names_it(monkeypatch):
    from pipelines.resources import RayResource
    port = free_port()  # nothing listens there
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=f"RAY_ADDRESS = '127.0.0.1:{port}' is unreachable"):
        RayResource()._ensure()
    assert time.perf_counter() - t0 < 10


# ----------------------------------------------------------------------------------------------
# MLflow server

@pytest.fixture
def mlflow_server(tmp_path):
    with mlflow_server_at(tmp_path / "server") as served:
        yield served


@pytest.mark.e2e
@pytest.mark.slow
def test_register_and_load_through_an_mlflow_server(tmp_path, mlflow_server, monkeypatch):
    from mlflow.tracking import MlflowClient

    from pipelines.resources import MlflowResource
    from tests.pipelines.test_registry import expected, fresh_env, load_in_fresh_process, smoke_checkpoints
    uri, start_s = mlflow_server
    t0 = time.perf_counter()
    home = tmp_path / "home"
    info = smoke_checkpoints(home, (5,))[0]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("K3_HOME", str(home))
    mlflow = MlflowResource()  # the URI from the environment, as `k3 run` would see it
    assert mlflow.resolved_tracking_uri() == uri and mlflow.is_server()
    client = MlflowClient(uri)
    run = client.create_run(mlflow.experiment_id())
    # A server-side artifact store: the client uploads through the server (mlflow-artifacts:/).
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")
    version, created = mlflow.register_checkpoint(run.info.run_id, "k3-smoke-base", info.path, info.sha256,
                                                  {"profile": "smoke"}, "through a server", home=home)
    assert created and version.source == f"runs:/{run.info.run_id}/model"
    client.set_registered_model_alias("k3-smoke-base", "champion", version.version)

    # A fresh process that sees neither the home nor the repository: the copy in the server's
    # artifact store and the model's own code are all it has.
    gen, logp = expected(info, [[1, 2, 3, 4], [5, 6]], 5)
    got = load_in_fresh_process(uri, "models:/k3-smoke-base@champion", fresh_env(), tmp_path)
    assert got["gen"] == gen and got["score"] == pytest.approx(logp, abs=1e-5)
    print(f"mlflow server: up in {start_s:.1f} s, register + fresh-process load {time.perf_counter() - t0:.1f} s")


def test_an_unreachable_mlflow_server_fails_fast_and_names_it(monkeypatch):
    from pipelines.resources import MlflowResource
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=f"MLFLOW_TRACKING_URI = '{uri}' is unreachable"):
        MlflowResource().client()
    assert time.perf_counter() - t0 < 10
