"""The functions the assets run as Ray tasks: a pretraining stage and a checkpoint evaluation.

They run in a Ray worker, so this module imports neither dagster nor ray: the worker loads only
torch, the library and (for live metrics) the MLflow client. Metrics go to the asset's MLflow run
as they are produced; the full history comes back to the asset as the return value.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from k3model.pretrain import PretrainConfig, PretrainResult
from k3model.pretrain_data import PretrainData


@dataclass(frozen=True)
class LiveLog:
    """Where a task sends its metrics while it runs: the asset's MLflow run, and stdout."""
    label: str
    tracking_uri: str | None = None
    run_id: str | None = None

    def __call__(self, step: int, metrics: dict) -> None:
        numeric = {k: float(v) for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))}
        if self.tracking_uri and self.run_id:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
            ts = int(time.time() * 1000)
            MlflowClient(self.tracking_uri).log_batch(
                self.run_id, metrics=[Metric(k, v, ts, step) for k, v in numeric.items()])
        shown = {k: v for k, v in numeric.items() if k in _SHOWN}
        print(f"[{self.label}] step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()),
              flush=True)


_SHOWN = ("train/main", "train/lr", "moe/load_max_over_mean", "perf/tokens_per_s", "eval/ppl",
          "eval/clue_acc/scattered/all", "eval/vqa_acc", "perf/wall_s")


def train_stage_task(cfg: PretrainConfig, data: PretrainData, work_dir: str,
                     init_checkpoint: str | None, live: LiveLog) -> PretrainResult:
    from k3model.pretrain import train
    return train(cfg, data, work_dir, init_checkpoint=init_checkpoint, log_fn=live)


def evaluate_checkpoint_task(checkpoint_dir: str, data: PretrainData, examples_per_cell: int,
                             live: LiveLog, step: int) -> dict[str, float]:
    """Re-score a checkpoint (hashes verified on load) with the model config its manifest records."""
    import torch

    from k3model.pretrain import eval_sizes, load_pretrained
    from k3model.pretrain_eval import evaluate

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, manifest = load_pretrained(checkpoint_dir, device)
    pretrain_cfg = manifest["config"]["pretrain"]
    _, windows, questions = eval_sizes(pretrain_cfg["profile"])
    t0 = time.perf_counter()
    metrics = evaluate(model, data, model.cfg, device=device, seed=pretrain_cfg["seed"],
                       examples_per_cell=examples_per_cell, ppl_windows=windows, vqa_questions=questions)
    metrics["perf/eval_wall_s"] = time.perf_counter() - t0
    live(step, metrics)
    return metrics
