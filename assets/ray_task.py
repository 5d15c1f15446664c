"""Ray plumbing shared by every asset's tasks (assets/pretrain_tasks.py, posttrain_tasks.py,
distill_tasks.py, deploy_tasks.py): the call a driver submits (`RayCall`), where it runs (`placement`,
`task_device`), how a task reports while it runs (`LiveLog`, `with_system_metrics`) and how the driver
shows it (`ProgressFeed`), and the interrupt flag the long waits check.

It runs in a Ray worker too, so it imports neither dagster nor ray: the worker loads only torch,
the library and (for live metrics) the MLflow client. Metrics go to the asset's MLflow run as they
are produced, and each progress line is also appended to a file the asset's driver tails into the
Dagster run's event feed (`context.log`). The full history comes back to the asset as the return
value. The clue-accuracy grid (one number per length × distance cell) is not logged as metrics: the
asset logs it as one table artifact (`assets.pretrain_tasks.grid_rows`), so MLflow's charts stay the
curves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_INTERRUPTED = threading.Event()


def note_interrupt() -> None:
    """Record that SIGINT or SIGTERM reached this process (`pipelines.console.watch_interrupts` calls it
    from a thread that reads the signal wakeup fd, which sees every signal whatever Python handler is
    in force)."""
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


def load_on_task_device(checkpoint) -> "torch.nn.Module":
    """A checkpoint's model (QAT as it trained), in eval mode on `task_device()`: a held-out
    evaluation plays on the GPU Ray gave the task, not on its CPUs."""
    from k3model.checkpoint import load_model
    return load_model(checkpoint, task_device())[0].eval()


WHERE_TAGS = ("k3/device", "k3/gpu", "k3/ray_resources", "k3/node")


def where_it_runs() -> dict[str, str]:
    """Where this Ray task runs its model, as MLflow tags (`WHERE_TAGS`): the device, the GPU's name,
    the resources Ray assigned it (e.g. {"CPU": 1.0, "GPU": 0.1111}) and the node."""
    import json
    import socket

    import ray
    import torch
    device = task_device()
    assigned = ray.get_runtime_context().get_assigned_resources() if ray.is_initialized() else {}
    return {"k3/device": device, "k3/gpu": torch.cuda.get_device_name() if device == "cuda" else "none",
            "k3/ray_resources": json.dumps({k: round(v, 4) for k, v in sorted(assigned.items())}),
            "k3/node": socket.gethostname()}


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
                self.run_id, metrics=[Metric(k, v, ts, step) for k, v in numeric.items() if charted(k)])
        # The headline metrics when the step has any; otherwise its first few (a phase's own
        # figures, e.g. one arm of claim 5's comparison), never an empty line.
        shown = {k: v for k, v in numeric.items() if k in _SHOWN} or dict(list(numeric.items())[:4])
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

        from mlflow.entities import RunTag
        from mlflow.tracking import MlflowClient
        MlflowClient(live.tracking_uri).log_batch(live.run_id, tags=[RunTag(k, v) for k, v in where_it_runs().items()])

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


def charted(name: str) -> bool:
    """Whether a training metric is logged to MLflow as a metric (a chart): not a cell of the
    clue-accuracy grid (a table artifact), nor a count (`eval/clue_n/...`, the n behind a rate, kept
    in the checkpoint manifest and the asset's metadata), so MLflow's charts open on the curves."""
    return not is_grid_metric(name) and not name.startswith("eval/clue_n/")


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
