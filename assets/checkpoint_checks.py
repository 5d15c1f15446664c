"""The checks of every checkpoint asset, both blocking: `checkpoint_intact` and `checkpoint_sound`
(issue 45 item 1, issue 46 item 5). This is the one home of a checkpoint check: the pretraining
stages and base_model get theirs here like every other checkpoint asset.

For its newest materialization (every materialized partition's, for a partitioned asset):

- `checkpoint_intact`: its files re-hash to what was recorded — every file its manifest lists to its
  sha256 (`k3model.checkpoint.verify_checkpoint`, confined to the checkpoint directory), and the
  weights to the data version the materialization recorded (`assets.lineage.upstream_problem`, the
  same test every read of an upstream makes);
- `checkpoint_sound`: its weights are all finite: for every floating tensor t of `model.safetensors`,
  count(¬isfinite(t)) = 0 (packed MXFP4 codes and scales are uint8 and have no non-finite values);
  and its training diverged nowhere: every value of every `train/*` or `*loss*` metric in the run's
  MLflow history (each logged step), in the checkpoint manifest's `metrics` and in the
  materialization's metadata is finite. It does not re-hash (`checkpoint_intact` does).

A failure fails the run that materialized the asset, so its downstream assets do not start from
it, and names the files, tensors or metrics (and steps) at fault. `checkpoint_sound` stands behind
the configs' own validation: an lr of `Infinity` that slips past them (issue 45: an sft_policy with
93 % NaN weights was published) stops here.
"""

import math
from pathlib import Path
from typing import Any

import dagster as dg
import torch
from safetensors import safe_open

from assets.lineage import Upstream, latest, upstream_problem
from k3model.checkpoint import WEIGHTS_FILE, CheckpointCorrupted, read_manifest

# The assets whose materialization is a k3model checkpoint directory.
CHECKPOINT_ASSETS = ("pretrain_stage_1", "pretrain_stage_2", "pretrain_stage_3", "pretrain_stage_4", "base_model",
                     "sft_policy", "rl_specialist", "mopd_student", "cross_harness", "quantized_student",
                     "draft_model")
CHECK_NAME = "checkpoint_sound"
INTACT_NAME = "checkpoint_intact"


def nonfinite_weights(directory: Path) -> dict[str, int]:
    """{tensor name: count of NaN/inf elements} for every floating tensor of the checkpoint that has any."""
    bad: dict[str, int] = {}
    with safe_open(str(directory / WEIGHTS_FILE), framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if t.is_floating_point():
                n = int((~torch.isfinite(t)).sum())
                if n:
                    bad[name] = n
    return bad


def _watched(name: str) -> bool:
    return name.startswith("train/") or "loss" in name


def nonfinite_metrics(values: dict[str, Any]) -> list[str]:
    """The `train/*` and `*loss*` entries of a flat metrics mapping whose value is a non-finite number."""
    return [f"{k}={v}" for k, v in values.items()
            if _watched(k) and isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)]


def nonfinite_history(client, run_id: str) -> list[str]:
    """`metric@step=value` for every non-finite point of the watched metrics an MLflow run logged."""
    run = client.get_run(run_id)
    bad = []
    for name in sorted(run.data.metrics):
        if _watched(name):
            bad += [f"{name}@{m.step}={m.value}" for m in client.get_metric_history(run_id, name)
                    if not math.isfinite(m.value)]
    return bad


def _mlflow_run_id(up: Upstream) -> str | None:
    # training.Trained records the run as a link ending in /<experiment id>/<run id>.
    url = up.metadata.get("mlflow_run")
    return str(url).rstrip("/").rsplit("/", 1)[-1] if url else None


def checkpoint_problems(up: Upstream, client=None) -> list[str]:
    """Why the checkpoint a materialization recorded is not sound: non-finite weights or training
    metrics ([] when sound). Its files are not re-hashed here (`checkpoint_intact` does that)."""
    try:
        manifest = read_manifest(up.path)
        bad = nonfinite_weights(up.path)
    except (CheckpointCorrupted, OSError, ValueError, RuntimeError) as e:
        # safetensors raises its own errors (subclasses of these) on a truncated or garbled file.
        return [f"cannot read the checkpoint {up.path}: {e}"]
    problems = []
    if bad:
        total = sum(bad.values())
        worst = ", ".join(f"{k} ({n})" for k, n in sorted(bad.items(), key=lambda kv: -kv[1])[:5])
        problems.append(f"{total} non-finite weights in {len(bad)} tensor(s) of {up.path}: {worst}")
    metrics = manifest.get("metrics")
    recorded = nonfinite_metrics(metrics if isinstance(metrics, dict) else {}) + nonfinite_metrics(up.metadata)
    if recorded:
        problems.append("non-finite training metrics recorded: " + ", ".join(sorted(set(recorded))[:10]))
    run_id = _mlflow_run_id(up)
    if client is not None and run_id:
        logged = nonfinite_history(client, run_id)
        if logged:
            problems.append(f"the training diverged: MLflow run {run_id} logged {len(logged)} non-finite point(s): "
                            + ", ".join(logged[:10]))
    return problems


def _checked_partitions(context: dg.AssetCheckExecutionContext, asset: dg.AssetsDefinition,
                        profile: str) -> list[tuple[str, Upstream]]:
    """(label, newest materialization) of the asset, of each materialized partition if partitioned."""
    name = asset.key.path[-1]
    partitions: list[str | None] = [None]
    if asset.partitions_def is not None:
        partitions = sorted(context.instance.get_materialized_partitions(asset.key))
    found = []
    for partition in partitions:
        up = latest(context.instance, profile, name, partition)
        if up is not None:
            found.append((f"{name}[{partition}]" if partition else name, up))
    return found


def _intact_check(asset: dg.AssetsDefinition, profile: str) -> dg.AssetChecksDefinition:
    name = asset.key.path[-1]

    @dg.asset_check(asset=asset, name=INTACT_NAME, blocking=True,
                    description="The newest checkpoint (each materialized partition's) re-hashes to its manifest "
                                "and to the version its materialization recorded.")
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        found = _checked_partitions(context, asset, profile)
        if not found:
            return dg.AssetCheckResult(passed=False, description=f"{profile}/{name} has no checkpoint: materialize it first")
        problems = [f"{label}: {p}" for label, up in found if (p := upstream_problem(up)) is not None]
        metadata: dict[str, object] = {"checkpoints": len(found)}
        if len(found) == 1:
            label, up = found[0]
            metadata["path"] = dg.MetadataValue.path(str(up.path))
            if not problems:
                manifest = read_manifest(up.path)
                metadata.update(sha256=manifest["sha256"], files=len(manifest["files"]))
        return dg.AssetCheckResult(
            passed=not problems, metadata=metadata,
            description="; ".join(problems) + f". Re-materialize {name}" if problems
            else f"{len(found)} checkpoint(s) re-hash to their manifests")
    return _check


def _sound_check(asset: dg.AssetsDefinition, profile: str) -> dg.AssetChecksDefinition:
    name = asset.key.path[-1]

    @dg.asset_check(asset=asset, name=CHECK_NAME, blocking=True, required_resource_keys={"mlflow"},
                    description="The newest checkpoint's weights (each materialized partition's) are all finite, and "
                                "no training loss or metric it logged is NaN or inf.")
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        found = _checked_partitions(context, asset, profile)
        if not found:
            return dg.AssetCheckResult(passed=False, description=f"{profile}/{name} has no checkpoint: materialize it first")
        client = context.resources.mlflow.client()
        problems = [f"{label}: {p}" for label, up in found for p in checkpoint_problems(up, client)]
        return dg.AssetCheckResult(
            passed=not problems, metadata={"checkpoints": len(found), "problems": len(problems)},
            description="; ".join(problems) + f". Fix the config (a finite, smaller lr) and re-materialize {name}"
            if problems else f"{len(found)} checkpoint(s) finite")
    return _check


def build(profile: str, assets: list[dg.AssetsDefinition]) -> list[dg.AssetChecksDefinition]:
    """`checkpoint_intact` and `checkpoint_sound` for every checkpoint asset among `assets` of `profile`."""
    return [make(a, profile) for a in assets
            if len(a.keys) == 1 and a.key.path[0] == profile and a.key.path[-1] in CHECKPOINT_ASSETS
            for make in (_intact_check, _sound_check)]
