"""Pretraining assets: four context stages, then the base model (docs/design.md §1).

    tokenizer, corpus, clue_data, image_data ─> pretrain_stage_1 ─> … ─> pretrain_stage_4 ─> base_model
                                             └─> balancing_ablation  (claim 2; read by the report only)

`build(profile)` makes them for one profile (keys `<profile>/pretrain_stage_1`, …, group
`<profile>_pretraining`) with their checks. Each stage asset calls `k3model.train.pretrain.train` as one Ray task (`assets.pretrain_tasks.train_stage_task`),
starting from the previous stage's checkpoint with no positional change, through the training
adapter (`assets.training`): while it trains, the task logs metrics to the asset's MLflow run and
its progress lines reach the Dagster run's event feed; afterwards the checkpoint moves to
`checkpoints/<profile>/<asset>/<run id>/`, the whole loss history goes to MLflow, the checkpoint is
registered as a model version (one per distinct checkpoint). The stage itself logs the
clue-accuracy grid (a table) to MLflow, plots the loss curve inline and reports the stage's evaluation: held-out perplexity, scattered-clue accuracy by distance
and by length, VQA accuracy, expert load max/mean (in training, and claim 2's measurement: the final
checkpoint over a fixed held-out mixed set, with its routing bias and with it zeroed), tokens/s and wall time. The data version is the
sha256 of the weights.

`balancing_ablation` is claim 2's "without balancing" measured on a run trained without it: two short
stage-1 runs from random weights (`k3model.train.pretrain.balancing_arms`), identical but for the MoE
balancing (the profile's, and none), trained as two concurrent Ray tasks; its metadata holds each
arm's held-out expert load (`<arm>/moe/heldout_…`), training-tail load and per-step load curve, and
its checkpoint is the unbalanced arm's. No stage starts from it.

Checks: `loss_fell` compares the stage's last and first training losses (not judged below
`LOSS_CHECK_MIN_STEPS` steps, where one noisy step decides it); `checkpoint_intact` and
`checkpoint_sound`, as on every checkpoint asset, come from assets/checkpoint_checks.py.
"""

from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from assets.config_bounds import AssetConfig
from assets.display import inline_png, markdown_table, sparkline
from assets.lineage import (Upstream, group, key, latest, profile_tags, require_upstream, require_upstreams, run_id,
                            tag_run)
from assets.plots import stage_losses
from assets.pretrain_tasks import grid_rows, train_stage_task
from assets.training import TrainingJob, register, run_arms, run_training
from k3model.checkpoint import CheckpointCorrupted, link_checkpoint, source_tree_sha256, verify_checkpoint

# Bumps whenever the library changes, so the UI marks checkpoints trained by older code as stale.
PRETRAIN_CODE_VERSION = source_tree_sha256(packages=("k3model", "kernels", "datagen"))[:12]
DATA_INPUTS = ("corpus", "tokenizer", "clue_data", "image_data")
NUM_STAGES = 4
RESOURCES = {"store", "mlflow", "ray"}
# Below this many steps the first-vs-last loss comparison is one noisy step against another.
LOSS_CHECK_MIN_STEPS = 10


class PretrainStageConfig(AssetConfig):
    """One stage; steps, batch_size, lr, balancing, quantile_window_tokens and eval_examples_per_cell
    default to the profile's (its stage row and model in k3model.config, EVAL_SIZES in
    k3model.train.pretrain)."""
    seed: int = Field(default=0, ge=0)
    steps: int | None = Field(default=None, ge=1, description="optimizer steps of this stage")
    batch_size: int | None = Field(default=None, ge=1)
    lr: float | None = Field(default=None, gt=0, description="peak learning rate")
    balancing: str | None = Field(default=None, description="MoE balancing: quantile, deepseek or none")
    quantile_window_tokens: int | None = Field(default=None, ge=0, description="tokens the quantile balancing "
                                               "bias averages its solutions over (0: each step's overwrites it, "
                                               "as K3; k3model/moe.py)")
    log_every: int = Field(default=10, ge=1, description="steps between live metric logs")
    ckpt_every: int = Field(default=0, ge=0, description="steps between resumable checkpoints (0: four per "
                            "stage; each holds the optimizer state, 12 bytes a parameter)")
    eval_max_length: int | None = Field(default=None, ge=1, description="longest clue-eval context scored at "
                                        "the end of the stage (default: every length of the grid)")
    eval_examples_per_cell: int | None = Field(default=None, ge=1, description="clue-eval examples per "
                                        "(length, distance) cell scored at the end of the stage (default: "
                                        "the profile's; tiny scores its whole grid)")
    optimizer: str | None = Field(default=None, description="muon: Per-Head Muon on the hidden matrices and AdamW "
                                  "on the rest (k3model/train/muon.py), or adamw throughout (default: the "
                                  "profile's, the winner of its A/B — tiny muon, small adamw)")
    qk_clip_tau: float | None = Field(default=None, gt=0, description="QK-Clip threshold on each MLA head's "
                                      "max attention logit (K2: 100); unset: logged, not clipped")
    compile_regions: bool = Field(default=False, description="CUDA only: compile the model's modules "
                                  "regionally (k3model.compiled) before the first step, the step that "
                                  "benchmarks/model/train_step.py --compile-regions times")

    @classmethod
    def profile_values(cls, profile: str, stage: int) -> dict[str, Any]:
        # What PretrainConfig.resolved() takes for a field left None.
        from k3model.config import get_profile
        from k3model.train.pretrain import eval_sizes
        p = get_profile(profile)
        row = p.stages[stage - 1]
        window = p.model.quantile_window_tokens if row.quantile_window_tokens is None else row.quantile_window_tokens
        return {"steps": row.steps, "batch_size": row.batch_size, "lr": row.lr, "balancing": p.model.balancing,
                "quantile_window_tokens": window, "eval_examples_per_cell": eval_sizes(profile)[0],
                "optimizer": p.optimizer}


def stage_name(stage: int) -> str:
    return f"pretrain_stage_{stage}"


def pretrain_data(context: dg.AssetExecutionContext, profile: str) -> tuple[Any, dict[str, Upstream]]:
    """The PretrainData bundle from the newest data assets of `profile`, and the upstream records."""
    from datagen.clues import CluesConfig
    from k3model.train.pretrain_data import PretrainData

    from assets.data import data_config_json

    ups = require_upstreams(context, DATA_INPUTS, profile)
    # Training packs its clue examples with the config the eval grid was built with.
    recorded = data_config_json(ups["clue_data"].path)
    clues = CluesConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()})
    data = PretrainData(tokenizer_path=ups["tokenizer"].path, corpus_path=ups["corpus"].path,
                        images_path=ups["image_data"].path, clue_eval_path=ups["clue_data"].path,
                        clues=clues)
    return data, ups


def verified(context, name: str, profile: str) -> Upstream:
    """The newest checkpoint of `name` for `profile`, its hashes checked."""
    up = require_upstream(context, name, profile)
    try:
        verify_checkpoint(up.path)
    except CheckpointCorrupted as e:
        raise dg.Failure(description=f"cannot start from {name}: {e}", allow_retries=False) from e
    return up


def clue_tables(ev: dict[str, float]) -> tuple[str, str]:
    """Markdown tables of clue accuracy by distance bucket and by length, scattered vs control, with
    the pairs each row scored (`n`) where the evaluation recorded it.

    The eval keys are `eval/clue_acc/<variant>/<key>`, key one of `d<lo>-<hi>`, `len<L>`,
    `len<L>/d<lo>-<hi>` (a cell) or `all`; counts are `eval/clue_n/<variant>/<key>`.
    """
    keys = {k.split("/", 3)[3] for k in ev if k.startswith("eval/clue_acc/")}

    def row(label: str, name: str, k: str) -> dict[str, Any]:
        out = {label: name, "scattered": ev.get(f"eval/clue_acc/scattered/{k}"),
               "control": ev.get(f"eval/clue_acc/control/{k}")}
        n = ev.get(f"eval/clue_n/scattered/{k}")
        return out if n is None else {**out, "n": int(n)}

    def table(prefix: str, label: str) -> str:
        mine = sorted((k for k in keys if k.startswith(prefix) and "/" not in k), key=_bucket_order)
        return markdown_table([row(label, k[len(prefix):], k) for k in mine])
    return table("d", "distance"), table("len", "length")


def _bucket_order(bucket: str) -> int:
    """`d0-32` → 0, `d128-256` → 128, `len64` → 64: buckets in numeric, not string, order."""
    return int(bucket.lstrip("dlen").split("-")[0])


def _loss_points(history: list[dict], n: int = 12) -> list[dict[str, Any]]:
    if not history:
        return []
    idx = sorted({round(i * (len(history) - 1) / max(n - 1, 1)) for i in range(n)})
    return [{"step": history[i]["step"], "train/main": round(history[i].get("train/main", float("nan")), 4),
             "lr": f"{history[i].get('train/lr', float('nan')):.2e}"} for i in idx]


REPORTED = ("eval/ppl", "eval/vqa_acc", "eval/clue_acc/scattered/all", "eval/clue_acc/control/all",
            "moe/load_max_over_mean", "moe/train_tail_load_max_over_mean", "moe/train_tail_dead_fraction",
            "moe/train_tail_tokens", "perf/tokens_per_s", "perf/wall_s", "train/first_loss",
            "train/final_loss")


def heldout_expert_load(data: Any, checkpoint: Path) -> dict[str, Any]:
    """Claim 2's measurement of one final checkpoint (a stage's, or a balancing arm's): expert load
    over the fixed held-out mixed set (text, clue and image rows, ≈ 64K tokens), with its routing
    bias and with it zeroed (k3model.train.expert_load)."""
    import torch

    from k3model.checkpoint import load_model
    from k3model.train.expert_load import checkpoint_expert_load, mixed_heldout_set

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, _ = load_model(checkpoint, device)
    vision = model.cfg.vision
    heldout = mixed_heldout_set(data, vision.tokens_per_image if vision is not None else None)
    return checkpoint_expert_load(model, heldout, device)


def materialize_stage(context: dg.AssetExecutionContext, config: PretrainStageConfig, stage: int,
                      profile: str) -> dg.MaterializeResult:
    from k3model.config import get_profile
    from k3model.train.pretrain import PretrainConfig

    tag_run(context, profile)
    name = stage_name(stage)
    op = f"{profile}__{name}"  # Dagster's op name for the key <profile>/<name>
    try:
        cfg = PretrainConfig(profile=profile, stage=stage, seed=config.seed, steps=config.steps,
                             batch_size=config.batch_size, lr=config.lr, balancing=config.balancing,
                             log_every=config.log_every, eval_examples_per_cell=config.eval_examples_per_cell,
                             ckpt_every=config.ckpt_every, eval_max_length=config.eval_max_length,
                             compile_regions=config.compile_regions, optimizer=config.optimizer,
                             qk_clip_tau=config.qk_clip_tau, quantile_window_tokens=config.quantile_window_tokens)
        resolved = cfg.resolved()
    except ValueError as e:
        raise dg.Failure(description=f"invalid config for {profile}/{name} (ops.{op}.config): {e}",
                         allow_retries=False) from e
    data, ups = pretrain_data(context, profile)
    init = verified(context, stage_name(stage - 1), profile) if stage > 1 else None
    inputs = {**ups, **({init.name: init} if init is not None else {})}

    ray = context.resources.ray
    context.log.info(f"{profile}/{name}: {resolved.steps} steps of {resolved.batch_size} × {resolved.seq_len} "
                     f"tokens, model {resolved.model.name}, from {init.name if init else 'random weights'}")
    needs_gpu = get_profile(profile).device == "cuda" or ray.cluster_gpus(log=context.log.info) >= 1

    def report(result, mlflow_run_id: str, report_dir: Path) -> dict[str, Any]:
        mlflow = context.resources.mlflow
        mlflow.log_rows(mlflow_run_id, grid_rows(result.eval), "eval/clue_acc_grid.json")
        plot = stage_losses(result.history, report_dir / "loss.png", f"{profile}/{name}")
        mlflow.client().log_artifact(mlflow_run_id, str(plot))
        return {"loss_plot": inline_png(plot, f"loss curve of {profile}/{name}")}

    trained = run_training(context, TrainingJob(
        profile=profile, name=name, task=train_stage_task, args=(cfg, data, str(init.path) if init else None),
        config=cfg, inputs=inputs, log_every=cfg.log_every, num_gpus=1.0 if needs_gpu else 0.0,
        params={"seq_len": resolved.seq_len, "steps": resolved.steps, "batch_size": resolved.batch_size,
                "lr": resolved.lr, "model": resolved.model.name},
        description=f"{profile} pretraining stage {stage} of {NUM_STAGES} ({resolved.steps} steps at "
                    f"sequence length {resolved.seq_len})",
        headline=lambda result: {k: result.eval[k] for k in HEADLINE if k in result.eval}, report=report))

    result = trained.result
    ev = result.eval
    by_distance, by_length = clue_tables(ev)
    from k3model.train.expert_load import flat_metrics
    expert_load = heldout_expert_load(data, trained.checkpoint)
    context.log.info(f"{profile}/{name}: held-out expert load max/mean "
                     f"{expert_load['with_bias']['load_max_over_mean']:.3f} (bias zeroed "
                     f"{expert_load['bias_zeroed']['load_max_over_mean']:.3f}), dead "
                     f"{expert_load['with_bias']['dead_fraction']:.3f}, over {expert_load['with_bias']['tokens']} tokens")
    return trained.materialize_result({
        **{k: float(f"{v:.4g}") for k, v in flat_metrics(expert_load).items()},
        "moe/heldout_expert_load": dg.MetadataValue.json(expert_load),
        "stage": stage,
        "seq_len": resolved.seq_len,
        "steps": resolved.steps,
        "tokens_seen": result.tokens_seen,
        # Rounded for reading (the losses stay exact for the loss_fell check); `eval` keeps every
        # figure at full precision.
        **{k: float(ev[k]) if k.startswith("train/") else float(f"{ev[k]:.4g}") for k in REPORTED if k in ev},
        "loss": sparkline([h.get("train/main", float("nan")) for h in result.history], "train/main",
                          f"train/main {ev.get('train/first_loss', float('nan')):.4f} → "
                          f"{ev.get('train/final_loss', float('nan')):.4f} over {len(result.history)} steps "
                          "(full plot: loss_plot)"),
        "clue_acc_by_distance": dg.MetadataValue.md(by_distance),
        "clue_acc_by_length": dg.MetadataValue.md(by_length),
        "loss_curve": dg.MetadataValue.md(markdown_table(_loss_points(result.history))),
        "eval": dg.MetadataValue.json({k: float(v) for k, v in ev.items()}),
    })


# The eval figures a registered model version carries as tags.
HEADLINE = ("eval/ppl", "eval/vqa_acc", "eval/clue_acc/scattered/all", "eval/clue_acc/control/all")


def _stage_asset(profile: str, stage: int) -> dg.AssetsDefinition:
    previous = stage_name(stage - 1) if stage > 1 else None
    start = f"{previous}'s checkpoint" if previous else "random weights"

    @dg.asset(pool="gpu", name=stage_name(stage), key_prefix=[profile], group_name=group(profile, "pretraining"),
              deps=[key(profile, n) for n in (*DATA_INPUTS, *([previous] if previous else []))],
              kinds={"pytorch", "ray"}, code_version=PRETRAIN_CODE_VERSION, required_resource_keys=RESOURCES,
              tags=profile_tags(profile),
              description=f"Pretraining context stage {stage} of {NUM_STAGES} at the {profile} profile's "
                          f"stage-{stage} sequence length, starting from {start}.")
    def _asset(context: dg.AssetExecutionContext,
               config: PretrainStageConfig.for_profile(profile, stage=stage)) -> dg.MaterializeResult:
        return materialize_stage(context, config, stage, profile)
    return _asset


def materialize_base_model(context: dg.AssetExecutionContext, profile: str) -> dg.MaterializeResult:
    tag_run(context, profile)
    last = verified(context, stage_name(NUM_STAGES), profile)
    store, mlflow = context.resources.store, context.resources.mlflow
    final = store.checkpoint_dir(profile, "base_model", run_id(context))
    # Hard links: the base model is the same bytes as the last stage, stored once.
    info = link_checkpoint(last.path, final)

    stages = []
    for s in range(1, NUM_STAGES + 1):
        up = latest(context.instance, profile, stage_name(s))
        ev = up.metadata.get("eval", {}) if up else {}
        row: dict[str, Any] = {"stage": s, "seq_len": up.metadata.get("seq_len") if up else None,
                               "ppl": ev.get("eval/ppl"), "vqa": ev.get("eval/vqa_acc")}
        buckets = sorted((k.split("/")[-1] for k in ev if k.startswith("eval/clue_acc/scattered/d")),
                         key=_bucket_order)
        row.update({b: ev[f"eval/clue_acc/scattered/{b}"] for b in buckets})
        stages.append(row)

    with mlflow.start_run(context, params={"profile": profile, "from": stage_name(NUM_STAGES),
                                           "sha256": info.sha256}, tags=profile_tags(profile)) as run:
        for row in stages:
            # ppl and VQA as curves over the stages; the distance buckets are in the table.
            mlflow.log_metrics(run.info.run_id, {f"stages/{k}": row[k] for k in ("ppl", "vqa")
                                                 if isinstance(row[k], float)}, step=row["stage"])
        mlflow.log_rows(run.info.run_id, stages, "stages.json")
        last_eval = latest(context.instance, profile, stage_name(NUM_STAGES)).metadata.get("eval", {})
        version = register(context, profile, f"k3-{profile}-base", final, info.sha256, run.info.run_id,
                           {k: last_eval[k] for k in HEADLINE if k in last_eval},
                           f"{profile} base model: the checkpoint of pretraining stage {NUM_STAGES}")
        mlflow.client().set_registered_model_alias(version.name, "champion", version.version)
    return dg.MaterializeResult(
        metadata={"path": dg.MetadataValue.path(str(final)), "sha256": info.sha256, "profile": profile,
                  "stages": dg.MetadataValue.md(markdown_table(stages)),
                  "mlflow_run": dg.MetadataValue.url(mlflow.run_url(run)),
                  "mlflow_model": dg.MetadataValue.url(mlflow.model_url(version.name, version.version)),
                  "model_version": f"{version.name}@champion = version {version.version}"},
        data_version=dg.DataVersion(info.sha256), tags=profile_tags(profile))


# ----------------------------------------------------------------------------------------------
# Claim 2's balancing ablation: a short stage-1 run without balancing beside one with it

ABLATION = "balancing_ablation"


class BalancingAblationConfig(AssetConfig):
    """The two arms (k3model.train.pretrain.balancing_arms); steps and balanced default to the
    profile's (BALANCING_ARM_STEPS, the model's balancing)."""
    seed: int = Field(default=0, ge=0)
    steps: int | None = Field(default=None, ge=1, description="optimizer steps of each arm (at most stage 1's "
                              "steps)")
    balanced: str | None = Field(default=None, description="the balanced arm's MoE balancing, quantile or "
                                 "deepseek; the other arm trains with none")
    log_every: int = Field(default=10, ge=1, description="steps between live metric logs")

    @classmethod
    def profile_values(cls, profile: str) -> dict[str, Any]:
        # What balancing_arms takes for a field left None.
        from k3model.config import get_profile
        from k3model.train.pretrain import BALANCING_ARM_STEPS
        p = get_profile(profile)
        return {"steps": BALANCING_ARM_STEPS.get(profile, p.stages[0].steps), "balanced": p.model.balancing}


def materialize_balancing_ablation(context: dg.AssetExecutionContext, config: BalancingAblationConfig,
                                   profile: str) -> dg.MaterializeResult:
    from k3model.config import get_profile
    from k3model.train.expert_load import flat_metrics
    from k3model.train.pretrain import UNBALANCED, balancing_arms

    tag_run(context, profile)
    try:
        arms = balancing_arms(profile, seed=config.seed, steps=config.steps, balanced=config.balanced,
                              log_every=config.log_every)
        resolved = {arm: cfg.resolved() for arm, cfg in arms.items()}
    except ValueError as e:
        raise dg.Failure(description=f"invalid config for {profile}/{ABLATION} (ops.{profile}__{ABLATION}.config): "
                                     f"{e}", allow_retries=False) from e
    data, ups = pretrain_data(context, profile)
    ray = context.resources.ray
    share = ray.placement(len(arms), require_gpu=get_profile(profile).device == "cuda", log=context.log.info)
    steps = next(iter(resolved.values())).steps
    context.log.info(f"{profile}/{ABLATION}: arms {', '.join(arms)} side by side, {steps} stage-1 steps each from "
                     f"random weights, as concurrent Ray tasks of {share['num_cpus']:g} CPU / {share['num_gpus']:g} GPU")
    jobs = [TrainingJob(
        profile=profile, name=ABLATION, partition=arm, task=train_stage_task, args=(cfg, data, None), config=cfg,
        inputs=ups, log_every=cfg.log_every, **share,
        params={"steps": resolved[arm].steps, "batch_size": resolved[arm].batch_size,
                "seq_len": resolved[arm].seq_len, "lr": resolved[arm].lr, "balancing": arm},
        description=f"{profile} claim-2 balancing ablation: {steps} stage-1 steps with balancing {arm}",
        headline=lambda result: {k: result.eval[k] for k in ("moe/train_tail_load_max_over_mean",)
                                 if k in result.eval})
        for arm, cfg in arms.items()]
    by_arm = run_arms(context, jobs, f"{profile}/{ABLATION}")
    own: dict[str, Any] = {"steps": steps, "balanced": next(a for a in arms if a != UNBALANCED),
                           "tokens_seen": by_arm[UNBALANCED].result.tokens_seen}
    measured, rows = {}, []
    for arm, trained in by_arm.items():
        load = heldout_expert_load(data, trained.checkpoint)
        measured[arm] = load
        # `<arm>/moe/heldout_…`: the same keys as a stage's, one set per arm.
        own.update({f"{arm}/{k}": float(f"{v:.4g}") for k, v in flat_metrics(load).items()})
        ev = trained.result.eval
        own.update({f"{arm}/{k}": float(f"{ev[k]:.4g}") for k in REPORTED if k.startswith("moe/") and k in ev})
        rows.append({"arm": arm, "held-out max/mean": load["with_bias"]["load_max_over_mean"],
                     "worst layer": load["with_bias"]["load_max_over_mean_worst"],
                     "dead": load["with_bias"]["dead_fraction"],
                     "per-batch sd / max": f"{load['with_bias']['per_batch']['sd']:.2f} / "
                                           f"{load['with_bias']['per_batch']['max']:.2f}",
                     "training, last 10 % of tokens": ev.get("moe/train_tail_load_max_over_mean"),
                     "held-out ppl": ev.get("eval/ppl")})
        context.log.info(f"{profile}/{ABLATION}[{arm}]: held-out expert load max/mean "
                         f"{load['with_bias']['load_max_over_mean']:.3f}, dead {load['with_bias']['dead_fraction']:.3f}")
    own["arms_table"] = dg.MetadataValue.md(markdown_table(rows))
    own["moe/heldout_expert_load"] = dg.MetadataValue.json(measured)
    own["load_curves"] = dg.MetadataValue.json({arm: [[h["step"], h["moe/load_max_over_mean"]]
                                                      for h in t.result.history if "moe/load_max_over_mean" in h]
                                                for arm, t in by_arm.items()})
    own["arms"] = dg.MetadataValue.json({arm: {"checkpoint": str(t.checkpoint), "sha256": t.info.sha256,
                                               "model_version": f"{t.version.name}/{t.version.version}"}
                                         for arm, t in by_arm.items()})
    # The asset's checkpoint (path, sha256, data version) is the arm trained without balancing.
    return by_arm[UNBALANCED].materialize_result(own)


def _balancing_ablation_asset(profile: str) -> dg.AssetsDefinition:
    @dg.asset(pool="gpu", name=ABLATION, key_prefix=[profile], group_name=group(profile, "pretraining"),
              deps=[key(profile, n) for n in DATA_INPUTS], kinds={"pytorch", "ray"}, code_version=PRETRAIN_CODE_VERSION,
              required_resource_keys=RESOURCES, tags=profile_tags(profile),
              description="Claim 2's ablation beside stage 1 (feeds only the report): two short stage-1 runs "
                          "from random weights, same data, seed and size, one with the profile's MoE balancing and "
                          "one with none; each final checkpoint's expert load over the held-out mixed set.")
    def _asset(context: dg.AssetExecutionContext,
               config: BalancingAblationConfig.for_profile(profile)) -> dg.MaterializeResult:
        return materialize_balancing_ablation(context, config, profile)
    return _asset


def _base_model_asset(profile: str) -> dg.AssetsDefinition:
    @dg.asset(name="base_model", key_prefix=[profile], group_name=group(profile, "pretraining"),
              deps=[key(profile, stage_name(NUM_STAGES))], kinds={"pytorch", "mlflow"}, code_version="1",
              required_resource_keys={"store", "mlflow"}, tags=profile_tags(profile),
              automation_condition=dg.AutomationCondition.eager(),
              description="The last stage's checkpoint, promoted: registered as the `champion` MLflow model "
                          "version, with every stage's evaluation side by side (claim 1: later stages answer "
                          "at longer distances).")
    def _asset(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        return materialize_base_model(context, profile)
    return _asset


# ----------------------------------------------------------------------------------------------
# Checks

def _loss_fell_check(asset: dg.AssetsDefinition, profile: str) -> dg.AssetChecksDefinition:
    name = asset.key.path[-1]

    @dg.asset_check(asset=asset, name="loss_fell",
                    description="The stage's final training loss (mean of its last 10% of steps) is below "
                                f"its first step's loss; not judged below {LOSS_CHECK_MIN_STEPS} steps.")
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        up = latest(context.instance, profile, name)
        first = up.metadata.get("train/first_loss") if up else None
        final = up.metadata.get("train/final_loss") if up else None
        if first is None or final is None:
            return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                       description=f"{profile}/{name} reports no training losses")
        steps = up.metadata.get("steps", 0)
        metadata = {"first_loss": first, "final_loss": final, "drop": first - final, "steps": steps}
        if steps < LOSS_CHECK_MIN_STEPS:
            return dg.AssetCheckResult(
                passed=True, severity=dg.AssetCheckSeverity.WARN, metadata={**metadata, "judged": False},
                description=f"not judged: {steps} step(s) < {LOSS_CHECK_MIN_STEPS} "
                            f"(loss {first:.4f} → {final:.4f})")
        return dg.AssetCheckResult(
            passed=bool(final < first), severity=dg.AssetCheckSeverity.WARN,
            description=f"loss {first:.4f} → {final:.4f} over {steps} step(s)",
            metadata={**metadata, "judged": True})
    return _check


def build(profile: str) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition]]:
    """The pretraining assets of `profile` (four stages, base_model and the balancing ablation) and the
    stages' checks."""
    stages = [_stage_asset(profile, s) for s in range(1, NUM_STAGES + 1)]
    base = _base_model_asset(profile)
    return [*stages, base, _balancing_ablation_asset(profile)], [_loss_fell_check(a, profile) for a in stages]
