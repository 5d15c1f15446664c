"""checkpoint_evals: the newest checkpoint of every pretraining stage, re-scored (the nightly job).

Training ends with a quick evaluation (a few clue examples per cell). This asset loads each stage's
newest checkpoint — its hashes verified on load — and scores the whole clue grid, perplexity and
VQA against the newest data, one Ray task per stage (concurrent on a cluster). The result is one
table with the stages side by side: the scattered-clue accuracy by distance across stages is
claim 1 of docs/design.md §5. `build(profile)` makes the asset `<profile>/checkpoint_evals` (group
`<profile>_evaluation`). Its history over nights shows drift from data or evaluation changes and
catches checkpoints damaged on disk.
"""

from typing import Any

import dagster as dg
from pydantic import Field

from assets.config_bounds import AssetConfig
from assets.display import inline_png, markdown_table
from assets.lineage import group, key, profile_tags, run_id, tag_run
from assets.plots import clue_accuracy_by_stage
from assets.pretrain import DATA_INPUTS, NUM_STAGES, PRETRAIN_CODE_VERSION, pretrain_data, stage_name, verified
from assets.pretrain_tasks import evaluate_checkpoint_task, grid_rows
from assets.ray_task import LiveLog, ProgressFeed


class EvalConfig(AssetConfig):
    examples_per_cell: int = Field(default=1_000_000, ge=1, description="clue-eval examples scored per "
                                   "(length, distance) cell; the default scores the whole grid")
    stages: list[int] = Field(default=list(range(1, NUM_STAGES + 1)), min_length=1,
                              description="which stages to re-score (default: all)")


def materialize_checkpoint_evals(context: dg.AssetExecutionContext, config: EvalConfig,
                                 profile: str) -> dg.MaterializeResult:
    from k3model.config import get_profile

    tag_run(context, profile)
    bad = sorted(set(config.stages) - set(range(1, NUM_STAGES + 1)))
    if bad:
        raise dg.Failure(description=f"ops.{profile}__checkpoint_evals.config.stages: {bad} are not stages; "
                                     f"choose from 1 … {NUM_STAGES}", allow_retries=False)
    data, _ = pretrain_data(context, profile)
    stages = {s: verified(context, stage_name(s), profile) for s in sorted(set(config.stages))}
    store, mlflow, ray = context.resources.store, context.resources.mlflow, context.resources.ray

    with mlflow.start_run(context, params={"profile": profile, "examples_per_cell": config.examples_per_cell,
                                           **{f"sha256.{stage_name(s)}": u.data_version for s, u in stages.items()}},
                          tags=profile_tags(profile)) as run:
        report = store.report_dir(profile, "checkpoint_evals", run_id(context))
        report.mkdir(parents=True, exist_ok=True)
        progress = report / "progress.log"
        live = LiveLog(f"{profile}/checkpoint_evals", mlflow.resolved_tracking_uri(), run.info.run_id,
                       str(progress))
        needs_gpu = get_profile(profile).device == "cuda" or ray.cluster_gpus(log=context.log.info) >= 1
        results = ray.map(evaluate_checkpoint_task,
                          [(str(u.path), data, config.examples_per_cell, live, s) for s, u in stages.items()],
                          num_gpus=1.0 if needs_gpu else 0.0, log=context.log.info,
                          tick=ProgressFeed(progress, context.log.info))

        rows, buckets = [], []
        for (s, up), ev in zip(stages.items(), results):
            row: dict[str, Any] = {"stage": s, "sha256": up.data_version[:12], "ppl": ev.get("eval/ppl"),
                                   "vqa": ev.get("eval/vqa_acc")}
            for k, v in ev.items():
                if k.startswith("eval/clue_acc/scattered/d") and k.count("/") == 3:
                    bucket = k.rsplit("/", 1)[1][1:]
                    row[bucket] = v
                    if bucket not in buckets:
                        buckets.append(bucket)
            rows.append(row)
        buckets.sort(key=lambda b: int(b.split("-")[0]))
        plot = clue_accuracy_by_stage(rows, buckets, report / "clue_acc_by_distance.png", profile)
        mlflow.client().log_artifact(run.info.run_id, str(plot))
        mlflow.log_rows(run.info.run_id, [{"stage": s, **row} for s, ev in zip(stages, results)
                                          for row in grid_rows(ev)], "eval/clue_acc_grid.json")

    table = [{"stage": r["stage"], "sha256": r["sha256"], "ppl": r["ppl"], "vqa": r["vqa"],
              **{b: r.get(b) for b in buckets}} for r in rows]
    return dg.MaterializeResult(
        metadata={"path": dg.MetadataValue.path(str(plot)), "profile": profile,
                  "plot": inline_png(plot, f"clue accuracy by distance, per stage ({profile})"),
                  "clue_acc_by_distance": dg.MetadataValue.md(markdown_table(table)),
                  **{f"stage_{r['stage']}/ppl": float(r["ppl"]) for r in rows if r["ppl"] is not None},
                  "evals": dg.MetadataValue.json({stage_name(s): ev for s, ev in zip(stages, results)}),
                  "mlflow_run": dg.MetadataValue.url(mlflow.run_url(run))},
        tags=profile_tags(profile))


def build(profile: str) -> list[dg.AssetsDefinition]:
    """`<profile>/checkpoint_evals`."""
    @dg.asset(pool="gpu", name="checkpoint_evals", key_prefix=[profile], group_name=group(profile, "evaluation"),
              deps=[key(profile, n) for n in (*DATA_INPUTS, *(stage_name(s) for s in range(1, NUM_STAGES + 1)))],
              kinds={"pytorch", "ray"}, code_version=PRETRAIN_CODE_VERSION, tags=profile_tags(profile),
              required_resource_keys={"store", "mlflow", "ray"},
              description="Every stage's newest checkpoint scored on the full clue grid, held-out perplexity "
                          "and VQA.")
    def checkpoint_evals(context: dg.AssetExecutionContext, config: EvalConfig) -> dg.MaterializeResult:
        return materialize_checkpoint_evals(context, config, profile)
    return [checkpoint_evals]
