"""The Ray tasks of the pretraining assets (assets/pretrain.py, assets/evaluation.py): no Dagster
import, so a Ray worker loads only the library.

- `train_stage_task`: one pretraining stage (`k3model.train.pretrain.train`), live metrics through
  the asset's `LiveLog`.
- `evaluate_checkpoint_task`: a checkpoint re-scored (hashes verified on load) with the model config
  its manifest records (`k3model.train.pretrain_eval.evaluate`).
- `grid_rows`: the clue-accuracy grid of an evaluation as table rows, which the assets log as one
  MLflow table artifact instead of one metric per cell.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from assets.ray_task import LiveLog, is_grid_metric, task_device

if TYPE_CHECKING:  # the worker imports the library inside the task; the driver's CLI needs no torch
    from k3model.train.pretrain import PretrainConfig, PretrainResult
    from k3model.train.pretrain_data import PretrainData


def grid_rows(ev: dict[str, float]) -> list[dict]:
    """The clue-accuracy grid as rows (variant, length, distance, accuracy); "all" where a key
    aggregates over a dimension (`d0-32` is every length, `len64` every distance)."""
    rows = []
    for name, value in sorted(ev.items()):
        if not is_grid_metric(name):
            continue
        _, _, variant, bucket = name.split("/", 3)
        length, distance = "all", "all"
        for part in bucket.split("/"):
            if part.startswith("len"):
                length = part[3:]
            elif part.startswith("d"):
                distance = part[1:]
        rows.append({"variant": variant, "length": length, "distance": distance, "accuracy": float(value)})
    return rows


def train_stage_task(cfg: PretrainConfig, data: PretrainData, init_checkpoint: str | None, work_dir: str,
                     live: LiveLog) -> PretrainResult:
    from k3model.train.pretrain import train
    return train(cfg, data, work_dir, init_checkpoint=init_checkpoint, log_fn=live)


def evaluate_checkpoint_task(checkpoint_dir: str, data: PretrainData, examples_per_cell: int,
                             live: LiveLog, step: int) -> dict[str, float]:
    """Re-score a checkpoint (hashes verified on load) with the model config its manifest records."""
    from k3model.checkpoint import load_model
    from k3model.train.pretrain import eval_sizes
    from k3model.train.pretrain_eval import evaluate

    device = task_device()
    model, manifest = load_model(checkpoint_dir, device)
    pretrain_cfg = manifest["config"]["pretrain"]
    _, windows, questions = eval_sizes(pretrain_cfg["profile"])
    t0 = time.perf_counter()
    metrics = evaluate(model, data, model.cfg, device=device, seed=pretrain_cfg["seed"],
                       examples_per_cell=examples_per_cell, ppl_windows=windows, vqa_questions=questions)
    metrics["perf/eval_wall_s"] = time.perf_counter() - t0
    live(step, metrics)
    return metrics

