"""Resources: the Ray cluster, MLflow tracking and the checkpoint store (docs/design.md §6).

Everything a run writes lives under one home directory, `K3_HOME` (default `<repo>/.k3`):

    .k3/dagster/        DAGSTER_HOME: dagster.yaml, sqlite run and event storage
    .k3/mlflow/         mlflow.db (the sqlite tracking store and model registry) and artifacts/
    .k3/data/<profile>/<asset>/<content hash>/        data files (Parquet, tokenizer.json)
    .k3/checkpoints/<profile>/<asset>/<run id>/       safetensors + manifest.json

Assets reach these through `context.resources.<key>` (`required_resource_keys`) rather than typed
parameters, so `assets/` never imports `pipelines/`: dependencies keep pointing one way.

Ray: one cluster per run, not per step. The Definitions use the in-process executor, so a run is one
process, and `RayResource` starts its cluster on first use (a run of data assets never starts one)
and stops it when the run ends. `RAY_ADDRESS` (or `address`) joins an existing cluster instead,
which is then left running; the code travels with the job as a Ray `runtime_env` working_dir (the
repository without .venv, .git, homes and results), so worker nodes need only the same Python,
torch and Ray. A cluster already initialized in this process (a test session's) is reused and left
running too. Every model task asks for the GPU share and CPUs of `assets.ray_task.placement`.

MLflow: sqlite under the home by default, or any `MLFLOW_TRACKING_URI` (an `http://` server; the
registry goes through the same server). Registered checkpoints are pyfunc models
(`log_checkpoint_model` writes them; `pipelines.registry` reads them). An unreachable Ray address or MLflow server fails in seconds, naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from assets.lineage import PROFILES as RUNNABLE_PROFILES
from assets.ray_task import RayCall, error_line, interrupted, placement

REPO_ROOT = Path(__file__).resolve().parent.parent


def k3_home() -> Path:
    """`K3_HOME` if set, else `.k3/` at the repository root."""
    return Path(os.environ.get("K3_HOME") or REPO_ROOT / ".k3").resolve()


def default_profile() -> str:
    return os.environ.get("K3_PROFILE", "tiny")


# ----------------------------------------------------------------------------------------------
# Profile

def check_profile_name(name: str, field: str = "profile") -> str:
    """`name` if it is a profile a run can use; otherwise a ValueError naming `field`."""
    if name == "k3":
        raise ValueError(f"{field} = 'k3': the full K3 shape is for parameter accounting only "
                         f"(`k3 params --profile k3`); choose one of {', '.join(RUNNABLE_PROFILES)}")
    if name not in RUNNABLE_PROFILES:
        raise ValueError(f"{field} = {name!r} is not a profile: choose one of {', '.join(RUNNABLE_PROFILES)}")
    return name



# ----------------------------------------------------------------------------------------------
# Ray

def local_gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def end_leftover_ray_processes(home: str, grace_s: float = 5.0, owner: int | None = None) -> list[int]:
    """SIGTERM, then SIGKILL after `grace_s`, every live Ray process whose environment holds
    K3_HOME=`home` (and, with `owner`, K3_RAY_DRIVER=`owner`: the local cluster that driver process
    started, as `RayResource` marks it); returns their pids. For an interrupted `k3 run`: a SIGTERM
    that cuts ray.init short can leave Ray's DashboardAgent and RuntimeEnvAgent waiting for a raylet
    that never comes (seen alive over 60 s later on a busy 2-core machine). Other runs may share the
    home, so `k3 run` passes its own pid. Linux /proc; elsewhere a no-op."""
    needle = f"K3_HOME={home}".encode()
    marker = None if owner is None else f"K3_RAY_DRIVER={owner}".encode()
    ended: list[int] = []
    # Sweep until a sweep finds nothing: a raylet cut short may still spawn its agents after the
    # first sweep (seen in a fresh-clone `make test`, 2026-12-01).
    for _ in range(5):
        pids = _signal_ray_processes(needle, marker)
        if not pids:
            break
        ended += pids
        deadline = time.monotonic() + grace_s
        for pid in pids:
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    return ended


def _signal_ray_processes(needle: bytes, marker: bytes | None = None) -> list[int]:
    """SIGTERM every live Ray process whose environment holds `needle` (and `marker`); their pids."""
    pids = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(proc_dir.name)
            environ = (proc_dir / "environ").read_bytes().split(b"\0")
            if pid == os.getpid() or needle not in environ or (marker is not None and marker not in environ):
                continue
            args = (proc_dir / "cmdline").read_bytes().split(b"\0")
            if (any(a.startswith(b"ray::") or b"/ray/" in a or a.endswith((b"raylet", b"gcs_server"))
                    for a in args) or (proc_dir / "comm").read_text().startswith("ray::")):
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
        except (OSError, ValueError):  # gone, or not ours to read
            continue
    return pids


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


# What a joined cluster's workers do not need from the repository (runtime_env working_dir): the
# environment, history, homes (checkpoints, MLflow stores) and results. Ray caps a working_dir at
# 500 MiB; the code itself is ~10 MB.
RUNTIME_EXCLUDES = [".venv", ".git", ".k3", ".k3-*", "homes", "results", "benchmarks/results", "mlruns",
                    "test-artifacts", ".gpu-*", ".whl", ".gl", "__pycache__", "*.egg-info", ".pytest_cache",
                    ".hypothesis", "build"]


def check_reachable(address: str, what: str, timeout_s: float = 5.0) -> None:
    """A ConnectionError naming `address` unless a TCP connection to its host:port opens within
    `timeout_s`: ray.init and MLflow's client otherwise retry for minutes before failing."""
    import socket
    from urllib.parse import urlsplit
    if address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError as e:  # a port that is not a number
        raise ValueError(f"{what} = {address!r} is not host:port: {e}") from e
    if not host or not port:
        raise ValueError(f"{what} = {address!r}: give host:port (e.g. 10.0.0.5:6379 or http://host:5000)")
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"{what} = {address!r} is unreachable ({host}:{port}: {e}); start it, or "
                              f"unset {what.split()[0]} to run locally") from e


def runtime_env(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """The runtime_env of a joined cluster: the repository as working_dir (Ray puts it first on the
    workers' sys.path), the home and MLflow URI the tasks write to, and GPUs hidden from tasks that
    asked for none (Ray 2.60 otherwise leaves CUDA_VISIBLE_DEVICES alone for num_gpus=0)."""
    env_vars = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1", "K3_HOME": str(k3_home())}
    for key in ("MLFLOW_TRACKING_URI", "K3_PROFILE"):
        if os.environ.get(key):
            env_vars[key] = os.environ[key]
    return {"working_dir": str(repo), "excludes": RUNTIME_EXCLUDES, "env_vars": env_vars}

def run_task(driver, threads: int, fn: Callable[..., Any], *args: Any) -> Any:
    """A Ray task's body: `fn(*args)` on `threads` torch threads (the task's CPUs), ended with the
    worker if the driver dies first (`pipelines.driver_watch.run_watched`). Ray sets OMP_NUM_THREADS
    once, from the CPUs of the task a worker process starts for, and reuses the worker for later
    tasks: without this a worker started for a 1-CPU task (a balancing arm) trained the next 2-CPU
    task (tiny's stage 1) on one thread, 3.5× slower (docs/log/hardening.md 2026-12-06)."""
    import torch

    from pipelines.driver_watch import run_watched
    torch.set_num_threads(threads)
    return run_watched(driver, fn, *args)


class RayResource(dg.ConfigurableResource):
    """A Ray cluster for the GPU-heavy steps: started locally once per run, or joined."""

    address: str | None = Field(default=None, description="join this cluster; default: RAY_ADDRESS, "
                                "else start a local one")
    num_cpus: int | None = Field(default=None, description="CPUs of a local cluster; default: all")
    num_gpus: int | None = Field(default=None, description="GPUs of a local cluster; default: "
                                 "torch.cuda.device_count() (0 on a CPU machine)")
    object_store_memory_mb: int = Field(default=256, ge=80, description="object store of a local "
                                        "cluster (Ray's default is 30% of RAM)")
    ship_code: bool = Field(default=True, description="on a joined cluster, send the repository as the "
                            "runtime_env working_dir; off: the workers' image already holds this code")
    _started_here: bool = PrivateAttr(default=False)

    def _ensure(self, log: Callable[[str], None] | None = None) -> None:
        self._start(log)
        if interrupted():  # a SIGTERM whose exception was lost (assets.ray_task.interrupted)
            self.teardown_after_execution(None)
            raise KeyboardInterrupt

    def _start(self, log: Callable[[str], None] | None) -> None:
        import ray
        if ray.is_initialized():
            return
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        t0 = time.perf_counter()
        on_sigterm = signal.getsignal(signal.SIGTERM)
        if address:
            check_reachable(address.removeprefix("ray://"), "RAY_ADDRESS")
            env = runtime_env() if self.ship_code else {"env_vars": {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}}
            ray.init(address=address, log_to_driver=True, runtime_env=env)
            what = f"joined Ray cluster at {address} ({ray.cluster_resources()}" + \
                   (", code shipped as the runtime_env working_dir)" if self.ship_code else ")")
        else:
            # Workers inherit the driver's environment: hide the GPUs from tasks that asked for none,
            # and mark the cluster as this driver's (end_leftover_ray_processes(owner=...)).
            os.environ["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "1"
            os.environ["K3_RAY_DRIVER"] = str(os.getpid())
            # Ray 2.60 turns on token auth and writes ~/.ray/auth_token; a private local cluster
            # needs none.
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            gpus = local_gpu_count() if self.num_gpus is None else self.num_gpus
            try:
                ray.init(num_cpus=self.num_cpus or os.cpu_count(), num_gpus=gpus,
                         object_store_memory=self.object_store_memory_mb << 20, include_dashboard=False,
                         log_to_driver=True)
            except SystemExit as e:
                # A SIGTERM during start-up meets Ray's own handler (sys.exit): stop what started
                # and report an interruption, as a SIGTERM at any other moment is.
                ray.shutdown()
                raise KeyboardInterrupt from e
            self._started_here = True
            what = f"started a local Ray cluster ({ray.cluster_resources()})"
        # ray.init replaces the driver's SIGTERM handler with sys.exit, which lands wherever the
        # driver happens to be (inside ray.get, Ray's C++ core then aborts the process). Keep the
        # caller's own handler: `k3 run` turns SIGTERM into its Ctrl-C path.
        if callable(on_sigterm) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_sigterm)
        if log:
            log(f"{what} in {time.perf_counter() - t0:.1f} s")

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._started_here:
            import ray
            ray.shutdown()
            self._started_here = False

    def cluster_gpus(self, log: Callable[[str], None] | None = None) -> float:
        self._ensure(log)
        import ray
        return float(ray.cluster_resources().get("GPU", 0.0))

    def node_cpus(self) -> float:
        """CPUs of the largest node: a task asking for more could never be scheduled."""
        return max(n.get("CPU", 0.0) for n in self.nodes())

    def nodes(self) -> list[dict[str, float]]:
        """The resources of every alive node ({"CPU": .., "GPU": .., ...})."""
        self._ensure()
        import ray
        return [n["Resources"] for n in ray.nodes() if n["Alive"]]

    def placement(self, n_tasks: int = 1, require_gpu: bool = False,
                  log: Callable[[str], None] | None = None) -> dict[str, float]:
        """{"num_cpus", "num_gpus"} for each of `n_tasks` concurrent model tasks
        (`assets.ray_task.placement`: a GPU, or a share of one, whenever the cluster has any)."""
        self._ensure(log)
        cpus, gpus = placement(self.nodes(), n_tasks, require_gpu)
        return {"num_cpus": cpus, "num_gpus": gpus}

    def run(self, fn: Callable[..., Any], *args: Any, num_gpus: float = 0.0,
            num_cpus: float | None = None, log: Callable[[str], None] | None = None,
            tick: Callable[[], None] | None = None) -> Any:
        """Run `fn(*args)` as one Ray task and return its result."""
        return self.map(fn, [args], num_gpus=num_gpus, num_cpus=num_cpus, log=log, tick=tick)[0]

    def map(self, fn: Callable[..., Any], arg_tuples: list[tuple], num_gpus: float = 0.0,
            num_cpus: float | None = None, log: Callable[[str], None] | None = None,
            tick: Callable[[], None] | None = None) -> list[Any]:
        """Run `fn(*args)` for every tuple as concurrent Ray tasks; results in the same order, or the
        first task's error raised (no retries).

        A task takes a whole node's CPUs by default: Ray sets OMP_NUM_THREADS to a task's CPU
        count, and torch would otherwise train on one thread. If the driver fails or is
        interrupted, the tasks are cancelled; if it is killed, they end by themselves
        (`pipelines/driver_watch.py`): no training outlives its run. `tick` is called about once a
        second while the tasks run, and once after they end (the assets use it to copy the tasks'
        progress into the Dagster run's event feed).
        """
        calls = [RayCall(fn, args, num_cpus=num_cpus, num_gpus=num_gpus) for args in arg_tuples]
        results = self.run_all(calls, log=log, tick=tick, fail_fast=True)
        return results

    def run_all(self, calls: list[RayCall], *, log: Callable[[str], None] | None = None,
                warn: Callable[[str], None] | None = None, tick: Callable[[], None] | None = None,
                fail_fast: bool = False, done: Callable[[int, Any], None] | None = None) -> list[Any]:
        """Submit every call as a Ray task at once (Ray packs them onto the cluster's CPUs and GPUs
        and queues the rest), then wait for all; results in the same order. `done(i, outcome)` is
        called in the driver as soon as call i's outcome (its result, or its last exception) is
        known, so a caller can record a finished task while the others still run.

        A task that raises is submitted again up to its `retries` times, each failure said through
        `warn` (the asset's `context.log.warning`, so it reaches the Dagster run log). A call whose
        last attempt failed leaves its exception (a `ray.exceptions.RayTaskError`, which is also an
        instance of the task's own exception class) in its place of the result list; with
        `fail_fast` the first failure instead cancels the other tasks and is raised. An interruption
        (Ctrl-C, SIGTERM) or a driver error cancels every task and is raised.
        """
        self._ensure(log)
        import ray
        from ray.exceptions import RayError
        gpus = self.cluster_gpus()
        for call in calls:
            if call.num_gpus > gpus:
                label = call.label or getattr(call.fn, "__name__", "task")
                raise ValueError(f"{label} asked Ray for {call.num_gpus:g} GPU(s) but the cluster has "
                                 f"{gpus:g}: use a CPU profile (smoke, tiny) or set RAY_ADDRESS "
                                 "to a cluster with GPUs")
        from pipelines.driver_watch import Driver
        driver = Driver.this_process()
        nodes = self.nodes()

        def submit(call: RayCall):
            # Unset: a GPU task gets a GPU node's CPUs, a CPU task the largest node's.
            cpus = (placement(nodes, 1, call.num_gpus > 0)[0] if call.num_cpus is None
                    else call.num_cpus)
            # Through run_watched, a task ends with this driver even when it dies by SIGKILL.
            remote = ray.remote(run_task).options(num_cpus=cpus, num_gpus=call.num_gpus, max_retries=0,
                                                  name=call.label or getattr(call.fn, "__name__", "task"))
            ref = remote.remote(driver, max(1, int(cpus)), call.fn, *call.args)
            refs.append(ref)
            return ref

        refs: list[Any] = []  # every task submitted, retries included: all are cancelled on an error
        for c in calls:
            submit(c)
        attempts = [1] * len(calls)
        results: list[Any] = [None] * len(calls)
        try:
            # Wait in short slices: a blocking ray.get can sit in Ray's C++ core for the whole task
            # and never run the driver's Python signal handlers (SIGTERM then did nothing).
            pending = dict(enumerate(list(refs)))
            while pending:
                ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=1.0)
                if interrupted():
                    raise KeyboardInterrupt
                if tick is not None:
                    tick()
                for i in [i for i, r in pending.items() if r in ready]:
                    try:
                        results[i] = ray.get(pending.pop(i))
                    except RayError as e:
                        call = calls[i]
                        label = call.label or getattr(call.fn, "__name__", "task")
                        if attempts[i] <= call.retries and not fail_fast:
                            attempts[i] += 1
                            if warn is not None:
                                warn(f"{label}: attempt {attempts[i] - 1} of {call.retries + 1} failed, "
                                     f"retrying: {error_line(e)}")
                            pending[i] = submit(call)
                            continue
                        if fail_fast:
                            raise
                        if warn is not None and call.retries:
                            warn(f"{label}: failed after {attempts[i]} attempt(s): {error_line(e)}")
                        results[i] = e
                    if done is not None:
                        done(i, results[i])
            return results
        except BaseException as e:
            for ref in refs:
                ray.cancel(ref, force=True)
            interrupt = _interrupt_behind(e)
            if interrupt is not None and interrupt is not e:
                # A signal handler raised inside Ray's Cython code, which then reports a SystemError
                # wrapping it: re-raise the interrupt itself so Dagster records an interruption.
                raise interrupt from None
            if isinstance(e, SystemExit):
                # Ray's default driver handler turns SIGTERM into SystemExit; say what happened.
                raise RuntimeError(f"interrupted by a termination signal; cancelled {len(refs)} Ray "
                                   "task(s)") from e
            raise


def _interrupt_behind(e: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or Dagster interruption in e's chain of causes, if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, (KeyboardInterrupt, dg.DagsterExecutionInterruptedError)):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


# ----------------------------------------------------------------------------------------------
# MLflow

# The experiment tag MLflow 3's UI reads to open an experiment on its runs table ("Model training")
# instead of the GenAI traces view.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def mlflow_key(name: str) -> str:
    """A param name MLflow accepts: a partition's `[domain|effort]` becomes `/domain/effort` (MLflow
    allows only alphanumerics, `_ - . : /` and spaces)."""
    return re.sub(r"[^\w\-. :/]+", "/", name).strip("/")


# The library the pyfunc model imports, shipped with it (MLflow code_paths).
CODE_PACKAGES = ("k3model", "kernels", "datagen", "envs")
MODEL_ARTIFACT = "model"


def log_checkpoint_model(client, run_id: str, checkpoint: Path, sha256: str, home: Path, copy: bool,
                         target: tuple[Path, str] | None = None) -> str:
    """Log `checkpoint` as a pyfunc model under the run's `model/` artifacts; returns its
    `runs:/` URI. `copy`: the checkpoint directory goes into the artifacts; else a pointer (its
    path relative to `home` and its sha256). `target` (path, sha256): a draft's target model."""
    import mlflow.pyfunc
    import torch
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec

    from pipelines.pyfunc_model import SAMPLING_PARAMS

    with tempfile.TemporaryDirectory(prefix="k3-pyfunc-") as tmp:
        artifacts: dict[str, str] = {}
        for name, (path, sha) in {"checkpoint": (checkpoint, sha256), **({"target": target} if target else {})}.items():
            # A pointer is a path in the home: a checkpoint kept elsewhere travels as a copy.
            if copy or not Path(path).resolve().is_relative_to(home.resolve()):
                artifacts[name] = str(path)
            else:
                pointer = Path(tmp) / f"{name}_pointer.json"
                pointer.write_text(json.dumps({"path": Path(path).resolve().relative_to(home.resolve()).as_posix(),
                                               "home": str(home.resolve()), "sha256": sha}))
                artifacts[f"{name}_pointer"] = str(pointer)
        params = ParamSchema([ParamSpec(k, _param_type(v), v) for k, v in SAMPLING_PARAMS.items()])
        out = Path(tmp) / MODEL_ARTIFACT
        mlflow.pyfunc.save_model(
            out, python_model=str(Path(__file__).with_name("pyfunc_model.py")), artifacts=artifacts,
            code_paths=[str(REPO_ROOT / p) for p in CODE_PACKAGES],
            # Given, not inferred: inference would load the model in a subprocess at every registration.
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "numpy", "safetensors", "pyarrow",
                              "tokenizers"],
            signature=ModelSignature(inputs=None, params=params))
        for junk in out.rglob("__pycache__"):
            import shutil
            shutil.rmtree(junk, ignore_errors=True)
        client.log_artifacts(run_id, str(out), MODEL_ARTIFACT)
    return f"runs:/{run_id}/{MODEL_ARTIFACT}"


def _param_type(value) -> str:
    return {bool: "boolean", int: "long", float: "double", str: "string"}[type(value)]


class MlflowResource(dg.ConfigurableResource):
    """MLflow tracking, on a sqlite store in the home or an MLflow server (`MLFLOW_TRACKING_URI`):
    one MLflow run per asset materialization.

    Links in asset metadata go through `k3 ui`'s Dagster webserver (`/k3/mlflow/...`), which
    redirects to wherever MLflow is served now; a link written by `k3 run` keeps working under any
    later `k3 ui --mlflow-port` (pipelines/webserver.py).
    """

    tracking_uri: str | None = Field(default=None, description="default: MLFLOW_TRACKING_URI, else "
                                     "sqlite:///<K3_HOME>/mlflow/mlflow.db")
    artifact_root: str | None = Field(default=None, description="default: <K3_HOME>/mlflow/artifacts on "
                                      "sqlite; the server's own artifact store on a server")
    experiment: str = "k3"
    checkpoint_artifacts: str = Field(default="auto", description="how a registered model carries its "
                                      "checkpoint: 'copy' (into the artifact store), 'pointer' (a sha256-"
                                      "checked path into the home), 'auto' (copy on a server, else pointer)")
    _checked: str | None = PrivateAttr(default=None)

    def resolved_tracking_uri(self) -> str:
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or \
            f"sqlite:///{k3_home() / 'mlflow' / 'mlflow.db'}"
        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        elif uri.startswith(("http://", "https://")) and self._checked != uri:
            # MLflow's client retries an unreachable server for minutes; fail in seconds instead.
            check_reachable(uri, "MLFLOW_TRACKING_URI")
            self._checked = uri
        return uri

    def is_server(self) -> bool:
        return self.resolved_tracking_uri().startswith(("http://", "https://"))

    def resolved_artifact_root(self) -> Path:
        return Path(self.artifact_root) if self.artifact_root else k3_home() / "mlflow" / "artifacts"

    def client(self):
        from mlflow.tracking import MlflowClient
        return MlflowClient(tracking_uri=self.resolved_tracking_uri(),
                            registry_uri=self.resolved_tracking_uri())

    def experiment_id(self) -> str:
        client = self.client()
        exp = client.get_experiment_by_name(self.experiment)
        if exp is not None:
            if exp.tags.get("mlflow.experimentKind") is None:
                for k, v in EXPERIMENT_KIND.items():
                    client.set_experiment_tag(exp.experiment_id, k, v)
            return exp.experiment_id
        if self.is_server() and not self.artifact_root:
            # The server's artifact store (proxied mlflow-artifacts:/), reachable from any client.
            return client.create_experiment(self.experiment, tags=EXPERIMENT_KIND)
        root = self.resolved_artifact_root()
        root.mkdir(parents=True, exist_ok=True)
        return client.create_experiment(self.experiment, artifact_location=root.resolve().as_uri(),
                                        tags=EXPERIMENT_KIND)

    @contextlib.contextmanager
    def start_run(self, context: dg.AssetExecutionContext, params: dict[str, Any],
                  tags: dict[str, str] | None = None, partition: str | None = None) -> Iterator[Any]:
        """An MLflow run for this asset, tagged with the Dagster run; FAILED if the body raises."""
        run = self.create_run(context, params, tags, partition)
        try:
            yield run
        except BaseException:
            self.end_run(run, "FAILED")
            raise
        self.end_run(run, "FINISHED")

    def create_run(self, context: dg.AssetExecutionContext, params: dict[str, Any],
                   tags: dict[str, str] | None = None, partition: str | None = None):
        """A new MLflow run for this asset (or one partition of it: `partition`, else the context's
        own partition key), named `<asset>-<dagster run>`, or `<partition> <asset>-<dagster run>`
        (the partition first: MLflow cuts long names, and the nine specialists differ only there);
        end it with `end_run`."""
        from mlflow.entities import Param
        client = self.client()
        asset = context.asset_key.to_user_string()
        # `context.run` is unset when an asset is called directly; the op context always has an id.
        dagster_run_id = context.op_execution_context.run_id
        all_tags = {"dagster_run_id": dagster_run_id, "asset": asset, **(tags or {})}
        if partition is None and context.has_partition_key:
            partition = context.partition_key
        if partition is not None:
            all_tags["partition"] = partition
        name = f"{partition} {asset}" if partition is not None else asset
        run = client.create_run(self.experiment_id(), tags=all_tags, run_name=f"{name}-{dagster_run_id[:8]}")
        client.log_batch(run.info.run_id, params=[Param(mlflow_key(k), str(v)[:6000]) for k, v in params.items()])
        return run

    def end_run(self, run, status: str) -> None:
        """Mark an MLflow run FINISHED or FAILED."""
        self.client().set_terminated(run.info.run_id, status)

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric
        ts = int(time.time() * 1000)
        batch = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
        self.client().log_batch(run_id, metrics=batch)

    def log_history(self, run_id: str, history: list[dict[str, float]], step_key: str = "step",
                    skip_steps: frozenset[int] = frozenset()) -> int:
        """Log every numeric entry of every history row at its step, except the rows whose step is in
        `skip_steps` (already logged live); returns the number of points logged."""
        from mlflow.entities import Metric
        ts = int(time.time() * 1000)
        batch = [Metric(k, float(v), ts, int(row[step_key])) for row in history
                 if int(row[step_key]) not in skip_steps
                 for k, v in row.items() if k != step_key and isinstance(v, (int, float))]
        client = self.client()
        # MLflow accepts at most 1000 metrics per log_batch call.
        for i in range(0, len(batch), 1000):
            client.log_batch(run_id, metrics=batch[i:i + 1000])
        return len(batch)

    def log_rows(self, run_id: str, rows: list[dict[str, Any]], artifact_file: str) -> None:
        """A table artifact (MLflow's `log_table`: shown in the run's Artifacts tab as a table)."""
        if rows:
            self.client().log_table(run_id, data={c: [r.get(c) for r in rows] for c in rows[0]},
                                    artifact_file=artifact_file)

    def register_checkpoint(self, run_id: str, model_name: str, checkpoint: Path, sha256: str,
                            tags: dict[str, str], description: str, home: Path | None = None,
                            target: tuple[Path, str] | None = None):
        """The model version of a checkpoint: a new version for new bytes, the existing one for bytes
        already registered (matched by the `sha256` tag). Returns (version, created).

        A new version is a pyfunc model logged to run `run_id` (`log_checkpoint_model`), carrying the
        checkpoint as a copy or a pointer (`checkpoint_artifacts`); its `checkpoint` tag is the path
        relative to `home` (default K3_HOME), which `pipelines.registry.load_model` resolves.
        `target` (path, sha256): the model a draft proposes for.
        """
        from mlflow.exceptions import MlflowException

        if self.checkpoint_artifacts not in ("auto", "copy", "pointer"):
            raise ValueError(f"checkpoint_artifacts = {self.checkpoint_artifacts!r}: use 'auto', 'copy' or 'pointer'")
        home = Path(home or k3_home()).resolve()
        checkpoint = Path(checkpoint).resolve()
        client = self.client()
        try:
            client.create_registered_model(model_name, description=description)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        for version in client.search_model_versions(f"name = '{model_name}'"):
            if version.tags.get("sha256") == sha256:
                return version, False
        copy = self.checkpoint_artifacts == "copy" or (self.checkpoint_artifacts == "auto" and self.is_server())
        source = log_checkpoint_model(client, run_id, checkpoint, sha256, home, copy, target)
        rel = checkpoint.relative_to(home).as_posix() if checkpoint.is_relative_to(home) else str(checkpoint)
        return client.create_model_version(model_name, source=source, run_id=run_id,
                                           tags={"sha256": sha256, "checkpoint": rel, **tags},
                                           description=description), True

    def run_url(self, run) -> str:
        """A link to the run, served by `k3 ui`'s Dagster webserver as a redirect to MLflow."""
        return f"/k3/mlflow/runs/{run.info.experiment_id}/{run.info.run_id}"

    def model_url(self, model_name: str, version: str) -> str:
        return f"/k3/mlflow/models/{model_name}/{version}"


# ----------------------------------------------------------------------------------------------
# Checkpoint and data store

class CheckpointStore(dg.ConfigurableResource):
    """Where data files and checkpoints go, per profile; the event log says which one is current."""

    root: str | None = Field(default=None, description="default: K3_HOME (<repo>/.k3)")

    def resolved_root(self) -> Path:
        return Path(self.root).resolve() if self.root else k3_home()

    def checkpoint_dir(self, profile: str, asset: str, run_id: str, partition: str | None = None) -> Path:
        """`checkpoints/<profile>/<asset>/[<partition dims>/]<run id>`; a partition key
        `general_tasks|low` becomes the folders `general_tasks/low`."""
        return self.resolved_root() / "checkpoints" / profile / asset / partition_path(partition) / run_id

    def data_dir(self, profile: str, asset: str) -> Path:
        return self.resolved_root() / "data" / profile / asset

    def hold_work_dir(self, work_dir: Path, label: str, say: Callable[[str], None] = print):
        """A context holding `work_dir` exclusively while a stage trains there
        (`pipelines.home_lock.hold_work_dir`): a second run of the same stage waits for the first."""
        from pipelines.home_lock import hold_work_dir
        return hold_work_dir(work_dir, label, say, interrupted=interrupted)

    def work_dir(self, profile: str, asset: str, inputs_key: str, partition: str | None = None) -> Path:
        """Where a training task writes while it runs. Keyed by its inputs, not the run: a run
        killed midway leaves its resumable `last/` checkpoint here, and the next run with the same
        config and data continues from it. Each partition has its own, so concurrent tasks never
        share a staging directory."""
        return self.resolved_root() / "work" / profile / asset / partition_path(partition) / inputs_key

    def report_dir(self, profile: str, asset: str, run_id: str, partition: str | None = None) -> Path:
        """Plots and tables an asset writes beside its checkpoint (not part of it)."""
        return self.resolved_root() / "reports" / profile / asset / partition_path(partition) / run_id


def partition_path(partition: str | None) -> str:
    """The relative folder of a partition key: `general_tasks|low` → `general_tasks/low`, none → `.`."""
    return "." if partition is None else partition.replace("|", "/")


def resources_for(home: Path | None = None) -> dict[str, dg.ConfigurableResource]:
    """The resource set, optionally pinned to a home directory (tests, notebooks).

    Left unset, the paths come from K3_HOME when a run starts. The profile is not a resource: it is
    the key prefix of the assets (assets/profiles.py).
    """
    if home is None:
        return {"ray": RayResource(), "mlflow": MlflowResource(), "store": CheckpointStore()}
    home = Path(home).resolve()
    return {
        "ray": RayResource(),
        "mlflow": MlflowResource(tracking_uri=f"sqlite:///{home / 'mlflow' / 'mlflow.db'}",
                                 artifact_root=str(home / "mlflow" / "artifacts")),
        "store": CheckpointStore(root=str(home)),
    }


# The resources every run gets.
RESOURCES = resources_for()
