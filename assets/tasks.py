"""The functions the assets run as Ray tasks: a pretraining stage and a checkpoint evaluation.

They run in a Ray worker, so this module imports neither dagster nor ray: the worker loads only
torch, the library and (for live metrics) the MLflow client. Metrics go to the asset's MLflow run
as they are produced, and each progress line is also appended to a file the asset's driver tails
into the Dagster run's event feed (`context.log`). The full history comes back to the asset as the
return value. The clue-accuracy grid (one number per length × distance cell) is not logged as
metrics: the asset logs it as one table artifact (`grid_rows`), so MLflow's charts stay the curves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the worker imports the library inside the task; the driver's CLI needs no torch
    from k3model.train.pretrain import PretrainConfig, PretrainResult
    from k3model.train.pretrain_data import PretrainData
    from k3model.train.recipes import EvalPlan, SpecialistEval

_INTERRUPTED = threading.Event()


def note_interrupt() -> None:
    """Record that SIGINT or SIGTERM reached this process (`pipelines.cli` calls it from a thread that
    reads the signal wakeup fd, which sees every signal whatever Python handler is in force)."""
    _INTERRUPTED.set()


def interrupted() -> bool:
    """True once a SIGINT or SIGTERM was noted (`note_interrupt`). The handler's own exception can be
    lost: Python drops an exception raised inside a garbage-collection callback ("Exception ignored
    in ..."), and a signal handler runs wherever the main thread is — a SIGTERM to `k3 run` once
    vanished in sqlalchemy's weakref callback while Dagster started a step, and the run went on to
    its end. The long waits (pipelines.resources) check this too."""
    return _INTERRUPTED.is_set()



@dataclass(frozen=True)
class RayCall:
    """One Ray task for `context.resources.ray.run_all`: `fn(*args)`, its resources (`num_cpus` None:
    the CPUs of the nodes it can run on, `placement`), how often a failure is submitted again, and a
    label for the log."""
    fn: Callable[..., Any]
    args: tuple
    num_cpus: float | None = None
    num_gpus: float = 0.0
    retries: int = 0
    label: str = ""


def placement(nodes: list[dict[str, float]], n_tasks: int = 1, require_gpu: bool = False) -> tuple[float, float]:
    """(num_cpus, num_gpus) for each of `n_tasks` concurrent model tasks (training, rollouts,
    evaluation) on a cluster whose alive nodes have the resources `nodes` ({"CPU": c, "GPU": g}).

    The one device rule: when the cluster has a GPU, every model task asks for one, or an equal
    share g = min(1, total GPUs / n_tasks) when several tasks share them (the nine specialists); its
    CPUs are sized from the GPU nodes, never from the largest node: a GPU task asking for a CPU-only
    node's core count could be placed nowhere, and Ray would leave it pending for ever. With
    k = min(n_tasks, floor(GPUs of the smallest GPU node / g)) tasks packed per GPU node, each asks
    for that node's CPUs / k (whole cores when at least one), so they fit side by side on every GPU
    node. Without a GPU: the largest node's CPUs / n_tasks, at least one core (a 2-core machine runs
    two at a time and queues the rest). `require_gpu` (a cuda profile) asks for a GPU even where the
    cluster has none, so `run_all` refuses the task with its name instead of training on a CPU.
    """
    if n_tasks < 1:
        raise ValueError(f"n_tasks = {n_tasks}: a placement is for at least one task")
    gpu_nodes = [n for n in nodes if n.get("GPU", 0.0) > 0]
    if not gpu_nodes:
        cpus = max((n.get("CPU", 0.0) for n in nodes), default=1.0)
        return float(max(1, int(cpus // n_tasks))), (1.0 if require_gpu else 0.0)
    total = sum(n["GPU"] for n in gpu_nodes)
    # Truncated, not rounded, so n shares never add up to more than the cluster holds.
    gpus = min(1.0, int(total / n_tasks * 10_000) / 10_000)
    smallest = min(gpu_nodes, key=lambda n: (n.get("CPU", 0.0), n["GPU"]))
    per_node = max(1, min(n_tasks, int(smallest["GPU"] / gpus + 1e-9)))
    cpus = smallest.get("CPU", 0.0) / per_node
    return (float(int(cpus)) if cpus >= 1 else int(cpus * 10_000) / 10_000), gpus


def task_device() -> str:
    """Where a Ray task runs its model: "cuda" when Ray gave it a GPU (it hides the GPUs from a task
    that asked for none: pipelines.resources sets RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO), else "cpu"."""
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def error_line(e: BaseException) -> str:
    """A task error's own message: the last line of the worker's traceback Ray puts in it."""
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(e).__name__


@dataclass(frozen=True)
class LiveLog:
    """Where a task sends its metrics while it runs: the asset's MLflow run, and stdout."""
    label: str
    tracking_uri: str | None = None
    run_id: str | None = None
    progress_path: str | None = None

    def __call__(self, step: int, metrics: dict) -> None:
        numeric = {k: float(v) for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))}
        if self.tracking_uri and self.run_id:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
            ts = int(time.time() * 1000)
            MlflowClient(self.tracking_uri).log_batch(
                self.run_id, metrics=[Metric(k, v, ts, step) for k, v in numeric.items()
                                      if not is_grid_metric(k)])
        shown = {k: v for k, v in numeric.items() if k in _SHOWN}
        line = f"[{self.label}] step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items())
        print(line, flush=True)
        if self.progress_path:
            # One short line per write, appended: concurrent tasks never interleave within a line.
            with open(self.progress_path, "a") as f:
                f.write(line + "\n")


def with_system_metrics(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` (a training task whose last argument is its LiveLog) with MLflow's system metrics
    (CPU, memory, disk, network; GPU where pynvml finds one) sampled every 5 s on the node the task
    runs on, logged to the task's MLflow run as `system/*`, tagged with the node."""
    live = args[-1]
    monitor = None
    if isinstance(live, LiveLog) and live.tracking_uri and live.run_id:
        import socket

        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        try:
            monitor = SystemMetricsMonitor(live.run_id, sampling_interval=5, samples_before_logging=1,
                                           node_id=socket.gethostname(), tracking_uri=live.tracking_uri)
            monitor.start()
        except ImportError as e:  # psutil missing: train anyway, say why there are no system metrics
            print(f"[{live.label}] no system metrics: {e}", flush=True)
            monitor = None
    try:
        return fn(*args)
    finally:
        if monitor is not None:
            monitor.finish()
            # finish() drops the samples of the last, unfinished interval (all of them for a task
            # shorter than one): log them as the final point.
            last = monitor.aggregate_metrics()
            if last:
                monitor.publish_metrics(last)
                monitor.mlflow_logger.flush()


def is_grid_metric(name: str) -> bool:
    """A cell of the clue-accuracy grid (`eval/clue_acc/<variant>/<bucket>`), not a headline figure
    (`eval/clue_acc/<variant>/all`)."""
    return name.startswith("eval/clue_acc/") and not name.endswith("/all")


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


_SHOWN = ("train/main", "train/lr", "fit/loss", "eval/loss", "eval/success_rate", "reward/mean", "moe/load_max_over_mean", "perf/tokens_per_s", "eval/ppl",
          "eval/clue_acc/scattered/all", "eval/vqa_acc", "perf/wall_s")


class ProgressFeed:
    """Called by the driver about once a second while tasks run: passes each new complete line of a
    progress file (written by `LiveLog`) to `log` (the asset's `context.log.info`)."""

    def __init__(self, path: str | Path, log: Callable[[str], None]):
        self.path, self.log, self.offset = Path(path), log, 0

    def __call__(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            self.log(line)


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


# ----------------------------------------------------------------------------------------------
# Post-training: SFT and the held-out evaluation of a policy

@dataclass
class PolicyResult:
    """What a post-training task returns: the trainer's result and the held-out evaluation of the
    trained policy (`evals`) and of its starting point on the same tasks (`start_evals`)."""
    checkpoint_dir: Path
    history: list[dict]
    metrics: dict[str, float]
    evals: dict[str, dict]
    start_evals: dict[str, dict]
    tokens_seen: int = 0
    resumed_from_step: int | None = None


def train_sft_task(cfg, demos_path: str, heldout_path: str, base_checkpoint: str, tokenizer_path: str,
                   plan: "EvalPlan", work_dir: str, live: LiveLog) -> PolicyResult:
    """SFT from the base model (`k3model.train.sft.train`, QAT as `cfg.qat`), then the held-out
    evaluation of the policy and of the base model on the same tasks."""
    from datagen.tokenizer import load_tokenizer
    from k3model.checkpoint import load_model
    from k3model.train.ladder import evaluate_policy
    from k3model.train.sft import train
    result = train(cfg, demos_path, work_dir, init_checkpoint=base_checkpoint, eval_demos=heldout_path, log_fn=live)
    tokenizer = load_tokenizer(tokenizer_path)
    t0 = time.perf_counter()
    evals = evaluate_policy(load_model(result.checkpoint_dir)[0].eval(), tokenizer, plan)
    start_evals = evaluate_policy(load_model(base_checkpoint)[0].eval(), tokenizer, plan)
    headline = {f"eval/success/{cell}": f["success_rate"] for cell, f in evals.items()}
    headline["perf/eval_wall_s"] = time.perf_counter() - t0
    live(cfg.steps, headline)
    return PolicyResult(Path(result.checkpoint_dir), result.history, {**result.metrics, **headline}, evals,
                        start_evals, result.tokens_seen, result.resumed_from_step)


# ----------------------------------------------------------------------------------------------
# RL: the task ladder and one specialist

def measure_ladder_task(policy_checkpoint: str, tokenizer_path: str, cfg, specs: dict | None) -> dict:
    """`k3model.train.ladder.measure_ladder` of the SFT policy: the report as JSON (`to_json`), its
    flat figures and its Markdown table."""
    from datagen.tokenizer import load_tokenizer
    from k3model.checkpoint import load_model
    from k3model.train.ladder import measure_ladder
    model = load_model(policy_checkpoint)[0].eval()
    report = measure_ladder(model, load_tokenizer(tokenizer_path), cfg, specs=specs)
    return {"json": report.to_json(), "metadata": report.as_metadata(), "table": report.table()}


def train_specialist_task(cfg, policy_checkpoint: str, tokenizer_path: str, domain: str, effort: str,
                          rl_tasks: list[tuple[str, int]], eval_tasks: list[tuple[str, int]], scoring: SpecialistEval,
                          work_dir: str, live: LiveLog) -> PolicyResult:
    """One RL specialist (`k3model.train.grpo.train` from the SFT policy on its ladder tasks), then
    the specialist and the SFT policy played the same way (`scoring`, the same generator seed) on
    the same held-out tasks of its domain at its effort, and the specialist on the domain's hard
    split. Tasks travel as (family, seed) pairs and are generated here."""
    import envs
    from datagen.tokenizer import load_tokenizer
    from k3model.checkpoint import load_model
    from k3model.train.evaluate import evaluate
    from k3model.train.grpo import train
    from k3model.train.ladder import hard_tasks
    from k3model.train.stats import paired_counts
    tokenizer = load_tokenizer(tokenizer_path)
    from k3model.train.flops import counting
    # Counted FLOPs of the RL (rollouts and updates), for mopd_student's equal-compute control.
    with counting() as flops:
        result = train(cfg, policy_checkpoint, tokenizer, work_dir, domain=domain, effort=effort,
                       tasks=[envs.generate(f, s) for f, s in rl_tasks], log_fn=live)
    result.metrics.update({f"flops/{k}": v for k, v in flops.as_dict().items()})
    held = [envs.generate(f, s) for f, s in eval_tasks]
    hard = hard_tasks(domain, scoring.hard_tasks)
    cell = f"{domain}/{effort}"
    t0 = time.perf_counter()

    def score(model, tasks):
        return evaluate(model, tokenizer, tasks, effort, samples=scoring.samples, temperature=scoring.temperature,
                        seed=scoring.seed, specs=cfg.efforts, max_episodes_per_batch=cfg.max_episodes_per_batch)

    specialist, sft = load_model(result.checkpoint_dir)[0].eval(), load_model(policy_checkpoint)[0].eval()
    # The domain's hard split (ladder.hard_tasks: where the scratchpad does real work) for claim 3's
    # "max scores at least as well as low on hard tasks", judged where sft_policy at low scores < 50 %
    # there, so sft_policy is scored on it at low too.
    mine, base = score(specialist, held), score(sft, held)
    evals = {cell: mine.as_metadata(), f"{cell}/hard": score(specialist, hard).as_metadata()}
    start = {cell: base.as_metadata()}
    if effort == "low":
        start[f"{cell}/hard"] = score(sft, hard).as_metadata()
    if scoring.samples == 1:
        # Claim 3's paired test: the same tasks and seeds for both, one episode each.
        b, c, n = paired_counts(mine.per_task, base.per_task)
        evals[cell].update({"paired/b": b, "paired/c": c, "paired/n": n})
    headline = {"eval/success_rate": evals[cell]["success_rate"], "perf/eval_wall_s": time.perf_counter() - t0}
    live(cfg.steps, headline)
    return PolicyResult(Path(result.checkpoint_dir), result.history, {**result.metrics, **headline}, evals, start,
                        int(result.metrics.get("rl/episodes_tokens", 0)), result.resumed_from_step)
