"""The model registry: every registered checkpoint is an MLflow pyfunc model.

    import mlflow
    m = mlflow.pyfunc.load_model("models:/k3-smoke-base@champion")  # any process, sqlite or server
    m.predict({"prompt_ids": [[1, 2, 3]]}, params={"max_new_tokens": 8})

    from pipelines.registry import load_model
    model, manifest = load_model("k3-smoke-base@champion")          # the K3Model itself

Every trained asset registers its checkpoint as a version of the MLflow model
`k3-<profile>-<asset>` (`base_model` as `k3-<profile>-base`, alias `champion`, as is the served
student); one version per distinct checkpoint, tagged with its sha256, profile, asset, its path in
the home (`checkpoint`) and headline figures. The version's source is `runs:/<run>/model`, a pyfunc
model (`pipelines/pyfunc_model.py`) logged to the asset's MLflow run, which an MLflow server accepts
(a local path outside the run's artifacts it rejects) and `mlflow.pyfunc.load_model` reads; versions
are written by `pipelines.resources.MlflowResource.register_checkpoint`, read here. The
model carries the checkpoint as a copy or as a sha256-verified pointer into the home
(`MlflowResource.checkpoint_artifacts`). `load_model` reads the checkpoint straight from the home
(`checkpoint` tag, relative to K3_HOME: a moved home still loads) and verifies its hashes.

A version's checkpoint must resolve (symlinks followed) to a directory inside the home: a `checkpoint`
tag that is absolute, climbs out with `..`, or links elsewhere is refused, so a registry entry cannot
make the loader read an arbitrary directory. Checkpoints kept in a store shared between homes are
allowed only when that store is named explicitly, by the `shared_store` argument or the environment
variable `K3_SHARED_STORE` (one directory; paths inside it may then be absolute).
"""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.resources import MlflowResource, k3_home, resources_for

SHARED_STORE_ENV = "K3_SHARED_STORE"


def resolve(model: str, home: Path | None = None):
    """The MLflow model version `model` names: `name@alias` or `name/version`."""
    mlflow: MlflowResource = resources_for(home)["mlflow"]
    client = mlflow.client()
    if "@" in model:
        name, alias = model.split("@", 1)
        return client.get_model_version_by_alias(name, alias)
    if "/" in model:
        name, version = model.rsplit("/", 1)
        return client.get_model_version(name, version)
    raise ValueError(f"model {model!r}: write 'name@alias' (k3-smoke-base@champion) or 'name/version' "
                     "(k3-smoke-pretrain_stage_1/1)")


def checkpoint_path(model: str, home: Path | None = None, shared_store: Path | None = None) -> Path:
    """The checkpoint directory of a registered model version, under `home` (default K3_HOME) or
    under the explicitly named `shared_store` (default $K3_SHARED_STORE, unset: none); ValueError
    naming the version and its source when the source resolves anywhere else."""
    version = resolve(model, home)
    root = Path(home or k3_home()).resolve()
    shared = shared_store or os.environ.get(SHARED_STORE_ENV) or None
    # The checkpoint's path in the home (the `checkpoint` tag; the version's own source is the pyfunc
    # model, runs:/<run>/model).
    source = str(version.tags.get("checkpoint") or version.source)
    path = (root / source).resolve()  # an absolute source replaces root here, then must pass the check
    allowed = [root] + ([Path(shared).resolve()] if shared else [])
    if not any(path.is_relative_to(a) and path != a for a in allowed):
        raise ValueError(f"model {model!r} (version {version.version}) has source {source[:200]!r}, which resolves "
                         f"to {path}, outside the home {root}"
                         + (f" and the shared store {allowed[1]}" if shared else "")
                         + f": re-register it with a path relative to the home, or name a store shared between "
                         f"homes with {SHARED_STORE_ENV} (or shared_store=)")
    return path


def load_model(model: str, device: str = "cpu", home: Path | None = None, shared_store: Path | None = None):
    """(K3Model, manifest) of a registered model version, its hashes verified on load."""
    from k3model.checkpoint import load_model as load
    return load(checkpoint_path(model, home, shared_store), device, qat=False)
