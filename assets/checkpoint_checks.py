"""`checkpoint_sound`: a blocking check on every checkpoint asset (issue 45 item 1, second line).

A checkpoint asset passes when, for its newest materialization (every materialized partition of a
partitioned one):

- its files are intact: every file its manifest lists re-hashes to the recorded sha256
  (`k3model.checkpoint.verify_checkpoint`, confined to the checkpoint directory);
- its weights are all finite: for every floating tensor t of `model.safetensors`,
  count(¬isfinite(t)) = 0 (packed MXFP4 codes and scales are uint8 and have no non-finite values);
- its training diverged nowhere: every value of every `train/*` or `*loss*` metric in the run's
  MLflow history (each logged step), in the checkpoint manifest's `metrics` and in the
  materialization's metadata is finite.

The check is blocking: a failure fails the run that materialized the asset, so its downstream
assets do not start from it, and the failure names the tensors or metrics (and steps) that are not
finite. It stands behind the configs' own validation: an lr of `Infinity` that slips past them
(issue 45: an sft_policy with 93 % NaN weights was published) stops here.
"""

import math
from pathlib import Path
from typing import Any

import dagster as dg
import torch
from safetensors import safe_open

from assets.lineage import Upstream, latest
from k3model.checkpoint import WEIGHTS_FILE, CheckpointCorrupted, verify_checkpoint

# The assets whose materialization is a k3model checkpoint directory.
CHECKPOINT_ASSETS = ("pretrain_stage_1", "pretrain_stage_2", "pretrain_stage_3", "pretrain_stage_4", "base_model",
                     "sft_policy", "rl_specialist", "mopd_student", "cross_harness", "quantized_student",
                     "draft_model")
CHECK_NAME = "checkpoint_sound"


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
    """Why the checkpoint a materialization recorded must not become an upstream ([] when sound)."""
    try:
        info = verify_checkpoint(up.path)
    except (CheckpointCorrupted, OSError) as e:
        return [str(e)]
    problems = []
    bad = nonfinite_weights(up.path)
    if bad:
        total = sum(bad.values())
        worst = ", ".join(f"{k} ({n})" for k, n in sorted(bad.items(), key=lambda kv: -kv[1])[:5])
        problems.append(f"{total} non-finite weights in {len(bad)} tensor(s) of {up.path}: {worst}")
    metrics = info.manifest.get("metrics")
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


def _sound_check(asset: dg.AssetsDefinition, profile: str) -> dg.AssetChecksDefinition:
    name = asset.key.path[-1]

    @dg.asset_check(asset=asset, name=CHECK_NAME, blocking=True, required_resource_keys={"mlflow"},
                    description="The newest checkpoint (each materialized partition's) re-hashes to its manifest, "
                                "its weights are all finite, and no training loss or metric it logged is NaN or inf.")
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        partitions: list[str | None] = [None]
        if asset.partitions_def is not None:
            partitions = sorted(context.instance.get_materialized_partitions(asset.key))
        client = context.resources.mlflow.client()
        problems, checked = [], 0
        for partition in partitions:
            up = latest(context.instance, profile, name, partition)
            if up is None:
                continue
            checked += 1
            label = f"{name}[{partition}]" if partition else name
            problems += [f"{label}: {p}" for p in checkpoint_problems(up, client)]
        if not checked:
            return dg.AssetCheckResult(passed=False, description=f"{profile}/{name} has no checkpoint: materialize it first")
        return dg.AssetCheckResult(
            passed=not problems, metadata={"checkpoints": checked, "problems": len(problems)},
            description="; ".join(problems) + f". Fix the config (a finite, smaller lr) and re-materialize {name}"
            if problems else f"{checked} checkpoint(s) intact and finite")
    return _check


def build(profile: str, assets: list[dg.AssetsDefinition]) -> list[dg.AssetChecksDefinition]:
    """One `checkpoint_sound` check for every checkpoint asset among `assets` of `profile`."""
    return [_sound_check(a, profile) for a in assets
            if len(a.keys) == 1 and a.key.path[0] == profile and a.key.path[-1] in CHECKPOINT_ASSETS]
