"""The one adapter every training asset goes through: a training callable as a Ray task with its
MLflow run, the checkpoint moved into the store and verified, registered as a model version, and
the standard metadata.

An asset builds its config, describes the training as a `TrainingJob`, calls `run_training` (one
job) or `run_trainings` (several, trained concurrently), and adds its own metadata:

    from assets.training import TrainingJob, run_training

    def materialize_sft_policy(context, config, profile):
        tag_run(context, profile)
        ups = require_upstreams(context, ["sft_data", "base_model"], profile)
        cfg = SFTConfig(profile=profile, steps=config.steps, ...)           # the library's config
        job = TrainingJob(
            profile=profile, name="sft_policy", config=cfg, inputs=ups,
            task=train_sft_task,                     # assets/posttrain_tasks.py: task(*args, work_dir, live)
            args=(cfg, str(ups["sft_data"].path), str(ups["base_model"].path)),
            description=f"{profile} SFT policy ({cfg.steps} steps, QAT on)",
            log_every=cfg.log_every,
            headline=lambda result: {k: result.metrics[k] for k in ("fit/loss",)},
        )
        trained = run_training(context, job)
        return trained.materialize_result({"steps": cfg.steps, "loss": ...})   # own metadata only

What `run_trainings` does for each job, in this order:

1. The inputs key: sha256 of the config's fields, the upstreams' data versions (and the partition),
   which names the work dir `work/<profile>/<asset>/[<partition>/]<key>/`. A run killed midway
   leaves its resumable `last/` there, and the next run with the same inputs continues from it;
   each partition has its own, so concurrent tasks never share a staging directory.
2. An MLflow run (`<asset>[<partition>]-<dagster run>`), its params the config's fields, the job's
   `params` and `data_version.<upstream>`; a `LiveLog` the task calls with its metrics, which go
   live to the MLflow run and, through a progress file the driver tails once a second, into the
   Dagster run's event feed (`context.log`).
3. The task, `task(*args, work_dir, live)`, returns a result with `.checkpoint_dir` and `.history`
   (and optionally `.resumed_from_step`). Every job is submitted at once; Ray packs them onto the
   cluster's CPUs or GPUs and queues the rest. A task that fails is submitted again up to
   `retries` times, each failure logged as a warning in the Dagster run.
4. As soon as a job's task returns (while the others still run), its checkpoint is moved
   (`os.replace`) to `checkpoints/<profile>/<asset>/[<partition>/]<run id>/`,
   the work dir removed, every file re-hashed (`verify_checkpoint`), the rest of the history
   logged (the task logged every `log_every`-th step live), then `report(result, mlflow_run_id,
   report_dir)` adds the asset's own MLflow artifacts and metadata, and the checkpoint is
   registered as a version of `k3-<profile>-<name>[-<domain>-<effort>]` (one version per distinct
   sha256, tagged with the `headline` figures).
5. The MLflow run ends FINISHED, or FAILED when its task or step 4 failed, and `on_trained(trained)`
   lets the asset record the finished job at once (`partition_materialization`), so a run killed
   later loses none of it. A failed job does not stop the others: its place in the returned list
   holds the exception.

`Trained.metadata(own)` is the standard metadata around an asset's own keys: `path`, `sha256`,
`profile` (and `partition`) first, then `data_versions`, `inputs_key`, `checkpoint_bytes`,
`code_version`, `mlflow_run`, `mlflow_model`, `model_version` (and `resumed_from_step`).

A partitioned asset that trains several partitions in one step (rl_specialist) records each
partition as materialized when it finishes (`partition_materialization`, logged from `on_trained`)
and ends with `partitioned_result`: the step's result when every partition succeeded, else a
failure naming the failed ones, the others staying recorded. Dagster (1.13) has no way for one step
to record its partitions one by one and still hand its output to the steps below it
(dagster-io/dagster#21072), so when every partition succeeds the step's output records them once
more, with the same metadata: a partition finished early shows two materializations of the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from assets.display import rounded
from assets.lineage import Upstream, profile_tags, run_id
from assets.ray_task import WHERE_TAGS, LiveLog, ProgressFeed, RayCall, charted, error_line, with_system_metrics
from k3model.checkpoint import CheckpointInfo, verify_checkpoint


@dataclass(frozen=True)
class TrainingJob:
    """One training task of an asset (one partition of it, for a partitioned asset)."""
    profile: str
    name: str  # the asset's name within the profile
    task: Callable[..., Any]  # task(*args, work_dir: str, live: LiveLog) -> result; imports no dagster
    args: tuple
    config: Any  # a dataclass: hashed into the inputs key, its fields logged as MLflow params
    inputs: Mapping[str, Upstream]
    description: str  # of the registered model version
    partition: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # more MLflow params (override the config's)
    log_every: int = 10  # the task's live-logging period: the other steps are logged afterwards
    num_cpus: float | None = None  # None: the CPUs of a node it can run on (assets.ray_task.placement)
    num_gpus: float = 0.0
    retries: int = 0
    model_name: str | None = None  # default: k3-<profile>-<name>[-<domain>-<effort>]
    model_target: Upstream | None = None  # a draft's target: its registered pyfunc model generates with both
    headline: Callable[[Any], Mapping[str, float]] | None = None  # figures tagged on the model version
    report: Callable[[Any, str, Path], Mapping[str, Any]] | None = None  # (result, mlflow run id, report dir)

    @property
    def label(self) -> str:
        return f"{self.profile}/{self.name}" + (f"[{self.partition}]" if self.partition else "")

    def resolved_model_name(self) -> str:
        if self.model_name:
            return self.model_name
        suffix = "-" + self.partition.replace("|", "-") if self.partition else ""
        return f"k3-{self.profile}-{self.name}{suffix}"

    def data_versions(self) -> dict[str, str]:
        return {n: u.data_version for n, u in self.inputs.items()}

    def inputs_key(self) -> str:
        what: dict[str, Any] = {"cfg": dataclasses.asdict(self.config), "inputs": self.data_versions()}
        if self.partition is not None:
            what["partition"] = self.partition
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Trained:
    """A finished job: its task's result, the promoted checkpoint, its MLflow run and model version."""
    job: TrainingJob
    result: Any
    checkpoint: Path
    info: CheckpointInfo
    mlflow_run: Any
    version: Any
    mlflow_run_url: str
    mlflow_model_url: str
    extra: dict[str, Any] = field(default_factory=dict)  # what the job's `report` returned
    where: dict[str, str] = field(default_factory=dict)  # where the task ran (ray_task.where_it_runs)

    def metadata(self, own: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The standard metadata around the asset's own keys (`own`, then what `report` returned)."""
        head: dict[str, Any] = {"path": dg.MetadataValue.path(str(self.checkpoint)), "sha256": self.info.sha256,
                                "profile": self.job.profile}
        if self.job.partition is not None:
            head["partition"] = self.job.partition
        tail: dict[str, Any] = {
            "data_versions": dg.MetadataValue.json(self.job.data_versions()),
            # What it was trained from (config, upstreams' versions, partition): a rerun with the
            # same key may reuse it rather than train again.
            "inputs_key": self.job.inputs_key(),
            "checkpoint_bytes": self.info.size_bytes,
            "code_version": dg.MetadataValue.json(self.info.manifest["code_version"]),
            "mlflow_run": dg.MetadataValue.url(self.mlflow_run_url),
            "mlflow_model": dg.MetadataValue.url(self.mlflow_model_url),
            "model_version": f"{self.version.name}/{self.version.version}",
        }
        for k, v in self.where.items():  # device, GPU, Ray's resources for the task, node
            tail[k.removeprefix("k3/")] = dg.MetadataValue.json(json.loads(v)) if k == "k3/ray_resources" else v
        resumed = getattr(self.result, "resumed_from_step", None)
        if resumed is not None:
            tail["resumed_from_step"] = resumed
        return {**head, **rounded(dict(own or {})), **rounded(self.extra), **tail}

    def materialize_result(self, own: Mapping[str, Any] | None = None) -> dg.MaterializeResult:
        """The asset's result: the standard metadata and `own`, the checkpoint's sha256 as data version."""
        return dg.MaterializeResult(metadata=self.metadata(own), data_version=dg.DataVersion(self.info.sha256),
                                    tags=profile_tags(self.job.profile))


def run_training(context: dg.AssetExecutionContext, job: TrainingJob) -> Trained:
    """`run_trainings` for one job; its failure is raised."""
    [outcome] = run_trainings(context, [job])
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def run_trainings(context: dg.AssetExecutionContext, jobs: list[TrainingJob],
                  on_trained: Callable[[Trained], None] | None = None) -> list[Trained | BaseException]:
    """Train every job as concurrent Ray tasks (module docstring); a Trained or the exception per job.
    Each job is promoted as soon as its task returns, then `on_trained(trained)` is called (in the
    driver, while the other tasks run)."""
    # Each work directory is this run's until its stage is promoted (another run waits).
    with contextlib.ExitStack() as held:
        return _run_trainings(context, jobs, held, on_trained)


def run_arms(context: dg.AssetExecutionContext, jobs: list[TrainingJob], what: str) -> dict[str, Trained]:
    """`run_trainings` for an asset that needs every arm: partition → Trained, or one dg.Failure (no
    retries) naming each arm that failed (`what`: the asset, e.g. "tiny/cross_harness")."""
    outcomes = run_trainings(context, jobs)
    failed = [(j.partition, o) for j, o in zip(jobs, outcomes) if isinstance(o, BaseException)]
    if failed:
        raise dg.Failure(description=f"{what}: arm(s) failed: " + "; ".join(f"{p}: {str(e)[:300]}" for p, e in failed),
                         allow_retries=False)
    return {j.partition: o for j, o in zip(jobs, outcomes)}


def _run_trainings(context: dg.AssetExecutionContext, jobs: list[TrainingJob], held: contextlib.ExitStack,
                   on_trained: Callable[[Trained], None] | None) -> list[Trained | BaseException]:
    store, mlflow, ray = context.resources.store, context.resources.mlflow, context.resources.ray
    dagster_run = run_id(context)
    staged, calls, feeds = [], [], []
    outcomes: list[Trained | BaseException | None] = [None] * len(jobs)
    ended: set[int] = set()

    def finish(i: int, result: Any) -> None:
        """Promote job i as soon as its task returned, end its MLflow run, let the asset record it."""
        job, work_dir, run = staged[i]
        ended.add(i)
        if isinstance(result, BaseException):
            mlflow.end_run(run, "FAILED")
            outcomes[i] = result
            return
        try:
            trained = _promote(context, job, work_dir, run, result)
        except BaseException as e:
            mlflow.end_run(run, "FAILED")
            if not isinstance(e, Exception) or len(jobs) == 1:
                raise
            outcomes[i] = e
            return
        mlflow.end_run(run, "FINISHED")
        outcomes[i] = trained
        if on_trained is not None:
            on_trained(trained)

    try:
        for job in jobs:
            work_dir = store.work_dir(job.profile, job.name, job.inputs_key(), job.partition)
            held.enter_context(store.hold_work_dir(work_dir, job.label, say=context.log.info))
            work_dir.mkdir(parents=True, exist_ok=True)
            progress = work_dir / f"progress-{dagster_run}.log"
            params = {**dataclasses.asdict(job.config), **job.params,
                      **{f"data_version.{n}": v for n, v in job.data_versions().items()}}
            run = mlflow.create_run(context, params=params, tags=profile_tags(job.profile), partition=job.partition)
            staged.append((job, work_dir, run))
            live = LiveLog(job.label, mlflow.resolved_tracking_uri(), run.info.run_id, str(progress))
            calls.append(RayCall(with_system_metrics, (job.task, *job.args, str(work_dir), live), num_cpus=job.num_cpus,
                                 num_gpus=job.num_gpus, retries=job.retries, label=job.label))
            feeds.append(ProgressFeed(progress, context.log.info))
        ray.run_all(calls, log=context.log.info, warn=context.log.warning,
                    tick=lambda: [feed() for feed in feeds], done=finish)
    except BaseException:
        for i, (_, _, run) in enumerate(staged):
            if i not in ended:
                mlflow.end_run(run, "FAILED")
        raise
    assert all(o is not None for o in outcomes), "run_all returned before every job finished"
    return outcomes  # type: ignore[return-value]


def _promote(context: dg.AssetExecutionContext, job: TrainingJob, work_dir: Path, run, result) -> Trained:
    store, mlflow = context.resources.store, context.resources.mlflow
    final = store.checkpoint_dir(job.profile, job.name, run_id(context), job.partition)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(result.checkpoint_dir, final)
    # The resumable state is only needed while the training is unfinished.
    shutil.rmtree(work_dir, ignore_errors=True)
    info = verify_checkpoint(final)

    # The task logged every `log_every`-th step live (and the last); the rest of the curve goes in now.
    history = [{k: v for k, v in h.items() if k == "step" or charted(k)} for h in result.history]
    last = history[-1]["step"] if history else None
    live_steps = frozenset(h["step"] for h in history if h["step"] % job.log_every == 0 or h["step"] == last)
    mlflow.log_history(run.info.run_id, history, skip_steps=live_steps)
    extra: dict[str, Any] = {}
    if job.report is not None:
        extra = dict(job.report(result, run.info.run_id,
                                store.report_dir(job.profile, job.name, run_id(context), job.partition)))
    headline = dict(job.headline(result)) if job.headline is not None else {}
    version = register(context, job.profile, job.resolved_model_name(), final, info.sha256, run.info.run_id,
                       headline, job.description, partition=job.partition,
                       target=(job.model_target.path, job.model_target.data_version) if job.model_target else None)
    tags = mlflow.client().get_run(run.info.run_id).data.tags
    return Trained(job=job, result=result, checkpoint=final, info=info, mlflow_run=run, version=version,
                   mlflow_run_url=mlflow.run_url(run), mlflow_model_url=mlflow.model_url(version.name, version.version),
                   extra=extra, where={k: tags[k] for k in WHERE_TAGS if k in tags})


def register(context: dg.AssetExecutionContext, profile: str, model_name: str, checkpoint: Path, sha256: str,
             mlflow_run_id: str, headline: Mapping[str, float], description: str, partition: str | None = None,
             target: tuple[Path, str] | None = None):
    """Register `checkpoint` as a version of MLflow model `model_name` (the existing version when the
    same bytes are already registered), tagged with the `headline` figures; logs which."""
    store, mlflow = context.resources.store, context.resources.mlflow
    tags = {"profile": profile, "asset": context.asset_key.to_user_string(), "dagster_run_id": run_id(context),
            **({"partition": partition} if partition is not None else {}),
            **{k: f"{v:.4g}" for k, v in headline.items()}}
    version, created = mlflow.register_checkpoint(mlflow_run_id, model_name, checkpoint, sha256, tags, description,
                                                  home=store.resolved_root(), target=target)
    context.log.info(f"{'registered' if created else 'already registered (same sha256)'}: MLflow model "
                     f"{version.name} version {version.version}; load it with "
                     f"mlflow.pyfunc.load_model('models:/{version.name}/{version.version}')")
    return version


# ----------------------------------------------------------------------------------------------
# Partitioned assets: several partitions trained in one step

def partitions_data_version(shas: Mapping[str, str]) -> str:
    """One data version for the partitions a step materialized (Dagster gives a step one data version
    per asset): sha256 over the sorted `partition=sha256` lines; each partition's own checkpoint hash
    is its `sha256` metadata."""
    text = "\n".join(f"{p}={s}" for p, s in sorted(shas.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def partition_materialization(context: dg.AssetExecutionContext, profile: str, partition: str,
                              metadata: Mapping[str, Any], sha256: str,
                              code_version: str | None) -> dg.AssetMaterialization:
    """The materialization of one partition of the step's asset, as the step's own output would
    record it (its checkpoint's sha256 as data version, the code version, a multi-partition key's
    dimensions), for the step to log as soon as the partition is done."""
    tags = {**profile_tags(profile), "dagster/data_version": sha256}
    if code_version is not None:
        tags["dagster/code_version"] = code_version
    partitions_def = context.assets_def.partitions_def
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        for dim, value in partitions_def.get_partition_key_from_str(partition).keys_by_dimension.items():
            tags[f"dagster/partition/{dim}"] = value
    return dg.AssetMaterialization(asset_key=context.asset_key, partition=partition, metadata=dict(metadata), tags=tags)


def partitioned_result(context: dg.AssetExecutionContext, profile: str,
                       done: Mapping[str, tuple[Mapping[str, Any], str]], failed: Mapping[str, BaseException],
                       recorded: frozenset[str] | set[str], code_version: str | None) -> Iterator[Any]:
    """Yield the end of a step that trained several partitions: `done` maps each partition that has
    a checkpoint to (its metadata, its sha256), `failed` each other one to its error, and `recorded`
    names those already logged (`partition_materialization`). When none failed, the step's
    MaterializeResult, each partition's metadata on its own materialization; otherwise the partitions
    of `done` not yet recorded are recorded one by one (their checkpoints are promoted and
    registered, so a rerun does not redo them) and the step fails naming each failed partition and
    its error."""
    if not failed:
        for p, (metadata, _) in done.items():
            context.add_asset_metadata(dict(metadata), partition_key=p)
        yield dg.MaterializeResult(
            data_version=dg.DataVersion(partitions_data_version({p: sha for p, (_, sha) in done.items()})),
            tags=profile_tags(profile))
        return
    for p, (metadata, sha) in done.items():
        if p not in recorded:
            yield partition_materialization(context, profile, p, metadata, sha, code_version)
    raise dg.Failure(
        description=f"{context.asset_key.to_user_string()}: {len(failed)} of {len(done) + len(failed)} partition(s) "
                    "failed (" + "; ".join(f"{p}: {error_line(e)}" for p, e in failed.items()) + ")"
                    + (f"; {', '.join(done)} succeeded and are recorded" if done else ""),
        allow_retries=False)
