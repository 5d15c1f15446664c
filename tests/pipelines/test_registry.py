"""The model registry: one version per distinct checkpoint, each an MLflow pyfunc model that a fresh
process loads with `mlflow.pyfunc.load_model("models:/...@champion")` and generates and scores with;
the checkpoint as a sha256-verified pointer into the home or as a copy in the artifact store. (The sqlite store records absolute artifact locations: after a
move, MLflow-native loading needs the home back in place; `pipelines.registry.load_model` does not.)"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from k3model.checkpoint import load_model as load_model_at, save_checkpoint
from k3model.config import get_profile
from k3model.engine import SamplingConfig, generate
from k3model.model import K3Model
from pipelines.registry import checkpoint_path, load_model
from pipelines.resources import resources_for

REPO = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter, from outside the repository: the model must bring its own code.
LOAD_AND_GENERATE = """
import json, sys
import mlflow
mlflow.set_tracking_uri(sys.argv[1])
m = mlflow.pyfunc.load_model(sys.argv[2])
gen = m.predict({"prompt_ids": [[1, 2, 3, 4], [5, 6]]}, params={"max_new_tokens": 5})
score = m.predict({"token_ids": [[1, 2, 3, 4]]}, params={"task": "score"})
print(json.dumps({"gen": [g["token_ids"] for g in gen], "score": score[0]["token_logprobs"],
                  "k3model": sys.modules["k3model"].__file__}))
"""


def smoke_checkpoints(home: Path, seeds) -> list:
    torch.manual_seed(0)
    model = K3Model(get_profile("smoke").model)
    manifest = {"config": {"model": dataclasses.asdict(model.cfg)}}
    infos = []
    for i, seed in enumerate(seeds):
        torch.manual_seed(seed)
        state = {k: torch.randn_like(v) * 0.05 if v.is_floating_point() else v for k, v in model.state_dict().items()}
        infos.append(save_checkpoint(home / "checkpoints" / "smoke" / "base_model" / f"run{i}", state, manifest))
    return infos


def expected(info, prompts, n):
    model = load_model_at(info.path)[0].eval()
    gen = [c.token_ids for c in generate(model, prompts, SamplingConfig(max_new_tokens=n))]
    ids = torch.tensor([[1, 2, 3, 4]])
    logp = model(ids).logits_BTV[0, :-1].float().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    return gen, logp.tolist()


def load_in_fresh_process(tracking_uri: str, model_uri: str, env: dict, cwd: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", LOAD_AND_GENERATE, tracking_uri, model_uri], cwd=cwd,
                         env=env, capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def fresh_env(**extra) -> dict:
    # No PYTHONPATH to the repository: the model's own code_paths must suffice.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "K3_HOME", "MLFLOW_TRACKING_URI")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def test_one_version_per_checkpoint_pyfunc_in_a_fresh_process_and_a_moved_home(tmp_path):
    home = tmp_path / "home"
    mlflow = resources_for(home)["mlflow"]
    client = MlflowClient(mlflow.resolved_tracking_uri())
    infos = smoke_checkpoints(home, (0, 0, 1))
    versions = []
    for info in infos:
        run = client.create_run(mlflow.experiment_id())
        version, created = mlflow.register_checkpoint(run.info.run_id, "k3-smoke-base", info.path, info.sha256,
                                                      {"profile": "smoke"}, "test model", home=home)
        versions.append((str(version.version), created))
    # Identical bytes (seed 0 twice) give no new version.
    assert versions == [("1", True), ("1", False), ("2", True)]
    client.set_registered_model_alias("k3-smoke-base", "champion", "2")
    v2 = client.get_model_version("k3-smoke-base", "2")
    assert v2.source.startswith("runs:/") and v2.tags["checkpoint"] == "checkpoints/smoke/base_model/run2"
    # A pointer, not a copy: the artifacts hold no weights.
    files = [a.path for a in client.list_artifacts(v2.run_id, "model/artifacts")]
    assert files == ["model/artifacts/checkpoint_pointer.json"]

    gen, logp = expected(infos[2], [[1, 2, 3, 4], [5, 6]], 5)
    got = load_in_fresh_process(mlflow.resolved_tracking_uri(), "models:/k3-smoke-base@champion", fresh_env(),
                                tmp_path)
    assert got["gen"] == gen
    assert got["score"] == pytest.approx(logp, abs=1e-5)
    # The model's own copy of the library (its code_paths), not the repository's or the editable install's.
    assert "/code/k3model/" in got["k3model"] and not got["k3model"].startswith(str(REPO))

    loaded, loaded_manifest = load_model("k3-smoke-base@champion", home=home)
    assert checkpoint_path("k3-smoke-base/1", home=home) == infos[0].path
    assert isinstance(loaded, K3Model) and loaded_manifest["config"]["model"]["name"] == "smoke"

    moved = tmp_path / "moved"
    shutil.move(home, moved)
    assert checkpoint_path("k3-smoke-base@champion", home=moved) == moved / infos[2].path.relative_to(home)
    again, _ = load_model("k3-smoke-base@champion", home=moved)
    for (k, a), b in zip(loaded.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k

    with pytest.raises(ValueError, match="write 'name@alias'"):
        load_model("k3-smoke-base", home=moved)


def test_a_version_whose_source_leaves_the_home_is_refused_unless_a_shared_store_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("K3_SHARED_STORE", raising=False)
    home, store = tmp_path / "home", tmp_path / "store"
    mlflow = resources_for(home)["mlflow"]
    client = MlflowClient(mlflow.resolved_tracking_uri())
    run = client.create_run(mlflow.experiment_id())
    torch.manual_seed(0)
    model = K3Model(get_profile("smoke").model)
    info = save_checkpoint(store / "base", model.state_dict(), {"config": {"model": dataclasses.asdict(model.cfg)}})
    (home / "checkpoints").mkdir(parents=True, exist_ok=True)
    (home / "checkpoints" / "link").symlink_to(store / "base")
    sources = {"absolute": str(info.path), "dotdot": "checkpoints/../../store/base", "symlink": "checkpoints/link",
               "system": "/etc", "the home itself": "."}
    client.create_registered_model("k3-smoke-base")
    for case, source in sources.items():
        # A hostile entry: the version's `checkpoint` tag (its path in the home) points elsewhere.
        version = client.create_model_version("k3-smoke-base", f"runs:/{run.info.run_id}/model", run.info.run_id,
                                              tags={"checkpoint": source}, description=case)
        with pytest.raises(ValueError, match=rf"version {version.version}\) has source .*outside the home.*K3_SHARED_STORE"):
            load_model(f"k3-smoke-base/{version.version}", home=home)
    # Named explicitly, the shared store is allowed (argument or environment), and nothing else is.
    assert checkpoint_path("k3-smoke-base/1", home=home, shared_store=store) == info.path.resolve()
    monkeypatch.setenv("K3_SHARED_STORE", str(store))
    loaded, _ = load_model("k3-smoke-base/2", home=home)
    assert isinstance(loaded, K3Model)
    with pytest.raises(ValueError, match="outside the home .* and the shared store"):
        checkpoint_path("k3-smoke-base/4", home=home)


def test_pointer_refuses_changed_bytes_and_copy_carries_the_weights(tmp_path):
    from pipelines.pyfunc_model import resolve_pointer
    home = tmp_path / "home"
    info = smoke_checkpoints(home, (3,))[0]
    pointer = tmp_path / "p.json"
    rel = info.path.relative_to(home).as_posix()
    pointer.write_text(json.dumps({"path": rel, "home": str(home), "sha256": "0" * 64}))
    with pytest.raises(ValueError, match="changed after registration"):
        resolve_pointer(pointer)
    pointer.write_text(json.dumps({"path": rel, "home": str(tmp_path / "nowhere"), "sha256": info.sha256}))
    with pytest.raises(FileNotFoundError, match="set K3_HOME"):
        resolve_pointer(pointer)

    mlflow = resources_for(home)["mlflow"].model_copy(update={"checkpoint_artifacts": "copy"})
    client = MlflowClient(mlflow.resolved_tracking_uri())
    run = client.create_run(mlflow.experiment_id())
    version, _ = mlflow.register_checkpoint(run.info.run_id, "k3-smoke-copy", info.path, info.sha256, {}, "copy",
                                            home=home)
    # MLflow copies a directory artifact under its own name.
    names = {a.path for a in client.list_artifacts(run.info.run_id, f"model/artifacts/{info.path.name}")}
    assert f"model/artifacts/{info.path.name}/model.safetensors" in names
    shutil.rmtree(info.path)  # the copy alone must do
    import mlflow as mlflow_lib
    # mlflow.set_tracking_uri also sets MLFLOW_TRACKING_URI in this process: unset both after, or
    # every later test's home would be this one's (pipelines.resources honours the variable).
    mlflow_lib.set_tracking_uri(mlflow.resolved_tracking_uri())
    try:
        m = mlflow_lib.pyfunc.load_model(f"models:/k3-smoke-copy/{version.version}")
        assert len(m.predict([[1, 2, 3]], params={"max_new_tokens": 3})[0]["token_ids"]) == 3
    finally:
        mlflow_lib.set_tracking_uri(None)
