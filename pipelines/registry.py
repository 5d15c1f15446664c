"""Loading a registered checkpoint: one call.

    from pipelines.registry import load_model
    model, manifest = load_model("k3-smoke-base@champion")     # or "k3-tiny-pretrain_stage_2/3"

Every pretraining stage registers its checkpoint as a version of the MLflow model
`k3-<profile>-<asset>` (`base_model` as `k3-<profile>-base`, alias `champion`); one version per
distinct checkpoint, tagged with its sha256, profile, asset and headline evaluation figures. A
version's source is the checkpoint's path in the checkpoint store *relative to K3_HOME*
(`checkpoints/smoke/base_model/<run id>`): the bytes are stored once, and moving the home moves
the registry with it. `load_model` resolves the source against the home and verifies the hashes.
"""

from __future__ import annotations

from pathlib import Path


def resolve(model: str, home: Path | None = None):
    """The MLflow model version `model` names: `name@alias` or `name/version`."""
    from pipelines.resources import MlflowResource, resources_for
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


def checkpoint_path(model: str, home: Path | None = None) -> Path:
    """The checkpoint directory of a registered model version, under `home` (default K3_HOME)."""
    from pipelines.resources import k3_home
    version = resolve(model, home)
    source = Path(version.source)
    return source if source.is_absolute() else Path(home or k3_home()).resolve() / source


def load_model(model: str, device: str = "cpu", home: Path | None = None):
    """(K3Model, manifest) of a registered model version, its hashes verified on load."""
    from k3model.checkpoint import load_model as load
    return load(checkpoint_path(model, home), device, qat=False)
