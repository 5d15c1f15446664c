"""Post-training assets: the SFT cold start, the RL task ladder and the nine RL specialists
(docs/design.md §1, issue 18).

    tokenizer ─> sft_data ─┐
    base_model ────────────┴─> sft_policy ─> rl_tasks ─> rl_specialist[domain × effort]

`build(profile)` makes them for one profile (keys `<profile>/sft_data`, …, group
`<profile>_posttraining`):

- `sft_data`: `datagen.sft.build_sft` with the profile's tokenizer (Parquet): expert demonstrations
  of every domain at the three efforts, and a held-out table of other task seeds (`heldout.parquet`
  beside it) for the own-token loss.
- `sft_policy`: `k3model.train.sft.train` from base_model, QAT on from the first step, through the
  training adapter (`assets.training`); then the policy and base_model are both played on the same
  held-out tasks (`k3model.train.evaluate`) per (domain, effort) and per harness.
- `rl_tasks`, `rl_specialist`: see their builders below.

Sizes per profile are in `k3model.train.recipes.POSTTRAIN_SIZES` (smoke: seconds per asset; tiny: minutes). The held-out evaluation
tasks come from `k3model.train.recipes.EVAL_SEED_BASE`, far from the RL prompts' seeds and from the
SFT demonstrations' (`datagen.sft.SFT_TASK_SEED_BASE`), so no evaluated task was trained on.
"""


import dataclasses
import time
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from assets.config_bounds import AssetConfig, ScaledEpisodes, refuse_unfit
from assets.data import _result as data_result
from assets.display import markdown_table, sparkline
from assets.lineage import group, key, profile_tags, require_upstreams, tag_run
from assets.posttrain_tasks import train_sft_task
from assets.storage import publish
from assets.training import TrainingJob, run_training
from k3model.checkpoint import source_tree_sha256
from k3model.train.effort import DOMAINS, EFFORTS, check_route, effort_specs, scaled_budgets
from k3model.train.evaluate import per_harness
from k3model.train.recipes import POSTTRAIN_SIZES, eval_plan, specialist_scoring
from k3model.train.stats import newcombe as rate_difference, paired_difference

POSTTRAIN_CODE_VERSION = source_tree_sha256(packages=("k3model", "kernels", "datagen", "envs"))[:12]
GROUP = "posttraining"
RESOURCES = {"store", "mlflow", "ray"}
# The nine specialists: one partition each, every one browsable on its own (`general_tasks|low`, …).
SPECIALIST_PARTITIONS = dg.MultiPartitionsDefinition({
    "domain": dg.StaticPartitionsDefinition(list(DOMAINS)), "effort": dg.StaticPartitionsDefinition(list(EFFORTS))})




def specialist_cell(partition_key: str) -> tuple[str, str]:
    """(domain, effort) of an rl_specialist partition key `<domain>|<effort>`; a ValueError that lists
    the keys for one that does not exist."""
    parts = partition_key.split("|")
    if len(parts) != 2:
        raise ValueError(f"partition key {partition_key!r} does not exist: rl_specialist's keys are "
                         f"<domain>|<effort>, one of {', '.join(SPECIALIST_PARTITIONS.get_partition_keys())}")
    check_route(*parts)
    return parts[0], parts[1]


# ----------------------------------------------------------------------------------------------
# sft_data

class SFTDataAssetConfig(AssetConfig):
    seed: int = Field(default=0, ge=0, description="seeds the demonstration tasks (same seed → same bytes); "
                      "the held-out table uses seed + 1")
    tasks_per_family: int | None = Field(default=None, ge=1, description="default: the profile's (POSTTRAIN_SIZES)")
    family_weights: dict[str, int] | None = Field(default=None, description="family → w: w × tasks_per_family "
                                                  "tasks for it (default: the profile's, POSTTRAIN_SIZES; {} for none)")

    @classmethod
    def profile_values(cls, profile: str) -> dict[str, Any]:
        sizes = POSTTRAIN_SIZES[profile]
        return {"tasks_per_family": sizes.sft_tasks_per_family, "family_weights": dict(sizes.sft_family_weights)}


def materialize_sft_data(context: dg.AssetExecutionContext, config: SFTDataAssetConfig,
                         profile: str) -> dg.MaterializeResult:
    from datagen.io import write_parquet
    from datagen.sft import HELD_OUT_HARNESS, SFTDataConfig, build_sft
    from datagen.tokenizer import load_tokenizer

    tag_run(context, profile)
    tokenizer_up = require_upstreams(context, ["tokenizer"], profile)["tokenizer"]
    sizes, config = POSTTRAIN_SIZES[profile], config.filled(profile)
    cfg = SFTDataConfig(seed=config.seed, tasks_per_family=config.tasks_per_family, families=sizes.sft_families,
                        max_tokens=sizes.sft_max_tokens, family_weights=tuple(sorted(config.family_weights.items())))
    # The held-out loss is a mean per (domain, effort): every family alike.
    heldout_cfg = dataclasses.replace(cfg, seed=cfg.seed + 1, tasks_per_family=sizes.sft_heldout_tasks_per_family,
                                      family_weights=())
    t0 = time.perf_counter()
    tok = load_tokenizer(tokenizer_up.path)
    table, heldout = build_sft(cfg, tok), build_sft(heldout_cfg, tok)
    path, sha = publish(context.resources.store.data_dir(profile, "sft_data"), "sft.parquet",
                        lambda p: write_parquet(table, p),
                        extra=lambda d: write_parquet(heldout, d / "heldout.parquet"))
    seconds = time.perf_counter() - t0

    cols = {c: table.column(c).to_pylist() for c in ("domain", "effort", "n_tokens", "n_own_tokens", "n_think_tokens")}
    rows = []
    for d in DOMAINS:
        for e in EFFORTS:
            idx = [i for i, (dd, ee) in enumerate(zip(cols["domain"], cols["effort"])) if (dd, ee) == (d, e)]
            n = max(len(idx), 1)
            rows.append({"domain": d, "effort": e, "rows": len(idx),
                         "tokens": sum(cols["n_tokens"][i] for i in idx) / n,
                         "own_tokens": sum(cols["n_own_tokens"][i] for i in idx) / n,
                         "think_tokens": sum(cols["n_think_tokens"][i] for i in idx) / n})
    from datagen.io import table_metadata
    meta = table_metadata(table)
    preview = table.select(["family", "domain", "harness", "effort", "n_tokens", "n_own_tokens",
                            "n_think_tokens"]).slice(0, 6).to_pylist()
    return data_result(context, profile, path, sha, table.num_rows, seconds, dataclasses.asdict(cfg), preview, {
        "by_domain_effort": dg.MetadataValue.md(markdown_table(rows)),
        "heldout_rows": heldout.num_rows,
        "heldout_path": dg.MetadataValue.path(str(path.parent / "heldout.parquet")),
        "held_out_harness": HELD_OUT_HARNESS,
        "harnesses": dg.MetadataValue.json(meta.get("harnesses", [])),
        "dropped_too_long": dg.MetadataValue.json(meta.get("dropped_too_long", {})),
    })


# ----------------------------------------------------------------------------------------------
# sft_policy

class SFTPolicyConfig(ScaledEpisodes):
    """The SFT run; steps, batch_size, lr and eval_tasks_per_family default to the profile's
    (POSTTRAIN_SIZES)."""
    seed: int = Field(default=0, ge=0)
    steps: int | None = Field(default=None, ge=1, description="optimizer steps")
    batch_size: int | None = Field(default=None, ge=1)
    lr: float | None = Field(default=None, gt=0, description="peak learning rate")
    log_every: int = Field(default=10, ge=1, description="steps between live metric logs")
    eval_tasks_per_family: int | None = Field(default=None, ge=1, description="held-out tasks per task "
                                              "family, each played at every effort")

    @classmethod
    def profile_values(cls, profile: str) -> dict[str, Any]:
        sizes = POSTTRAIN_SIZES[profile]
        return {"steps": sizes.sft_steps, "batch_size": sizes.sft_batch_size, "lr": sizes.sft_lr,
                "eval_tasks_per_family": sizes.eval_tasks_per_family}

    def check_fits(self, profile: str) -> None:
        from k3model.config import get_profile
        from k3model.limits import ram_bytes, step_floor_bytes

        from assets.config_bounds import SFT_ROW_FLOOR_TOKENS
        if not self.overridden("batch_size", profile):
            return
        need, ram = step_floor_bytes(get_profile(profile).model, self.batch_size, SFT_ROW_FLOOR_TOKENS), ram_bytes()
        if need > ram:
            gib = 1 << 30
            raise ValueError(f"batch_size={self.batch_size} rows of at least {SFT_ROW_FLOOR_TOKENS} tokens need at "
                             f"least {need / gib:.1f} GiB per step (the logits and their gradient alone), more "
                             f"than this machine's {ram / gib:.1f} GiB of RAM: lower batch_size (at most "
                             f"{max(ram * self.batch_size // need, 1)} would pass this bound)")


def success_rows(evals: dict[str, dict], start: dict[str, dict], start_name: str) -> list[dict[str, Any]]:
    """One row per (domain, effort) cell: the policy's success (with its 95 % interval) and tokens per
    answer beside the starting policy's on the same tasks."""
    rows = []
    for cell, f in evals.items():
        domain, effort = cell.split("/")
        s = start.get(cell, {})
        rows.append({"domain": domain, "effort": effort, "n": f["n"], "success": f["success_rate"],
                     "ci95": f"[{f['ci95_low']:.2f}, {f['ci95_high']:.2f}]", "tokens/answer": f["mean_policy_tokens"],
                     f"{start_name} success": s.get("success_rate"),
                     f"{start_name} tokens/answer": s.get("mean_policy_tokens")})
    return rows


def _mean(evals: dict[str, dict], field_name: str) -> float:
    return sum(f[field_name] for f in evals.values()) / max(len(evals), 1)


def materialize_sft_policy(context: dg.AssetExecutionContext, config: SFTPolicyConfig,
                           profile: str) -> dg.MaterializeResult:
    from k3model.train.sft import SFTConfig

    tag_run(context, profile)
    refuse_unfit(context, config, profile, "sft_policy")
    op = f"{profile}__sft_policy"
    config = config.filled(profile)
    try:
        cfg = SFTConfig(profile=profile, seed=config.seed, steps=config.steps, batch_size=config.batch_size,
                        lr=config.lr, qat=True, log_every=config.log_every)
    except ValueError as e:
        raise dg.Failure(description=f"invalid config for {profile}/sft_policy (ops.{op}.config): {e}",
                         allow_retries=False) from e
    # base_model first: a missing one is named in the message, with the command that makes it.
    ups = require_upstreams(context, ["base_model", "sft_data", "tokenizer"], profile)
    plan = eval_plan(profile, config.eval_tasks_per_family, config.budget_scale)
    demos = ups["sft_data"].path
    ray = context.resources.ray
    context.log.info(f"{profile}/sft_policy: {cfg.steps} steps of {cfg.batch_size} demonstrations from base_model, "
                     f"QAT on; then {plan.tasks_per_family} held-out task(s) per family at each effort")

    def report(result, mlflow_run_id: str, report_dir: Path) -> dict[str, Any]:
        mlflow = context.resources.mlflow
        mlflow.log_rows(mlflow_run_id, success_rows(result.evals, result.start_evals, "base_model"),
                        "eval/success_by_domain_effort.json")
        return {}

    trained = run_training(context, TrainingJob(
        profile=profile, name="sft_policy", task=train_sft_task,
        args=(cfg, str(demos), str(demos.parent / "heldout.parquet"), str(ups["base_model"].path),
              str(ups["tokenizer"].path), plan),
        config=cfg, inputs=ups, log_every=cfg.log_every,
        **ray.placement(log=context.log.info),
        params={"eval_tasks_per_family": plan.tasks_per_family, "eval_seed": plan.seed},
        description=f"{profile} SFT policy: base_model fine-tuned {cfg.steps} steps on expert demonstrations "
                    "at three efforts, QAT (MXFP4 weights, MXFP8 activations on the routed experts) from step 1",
        headline=lambda r: {"eval/success_rate": _mean(r.evals, "success_rate"),
                            **{k: r.metrics[k] for k in ("fit/loss", "eval/loss") if k in r.metrics}},
        report=report))

    r = trained.result
    m = r.metrics
    harness = per_harness(r.evals)
    base_harness = per_harness(r.start_evals)
    # Per cell: own-token loss, and the replay floors of success on held-out demonstrations
    # (k3model.train.sft.demo_loss): P(a temperature-1 sample replays it), greedy replays it.
    loss_rows = [{"domain": d, "effort": e, "fit": m.get(f"fit/loss/{d}/{e}"), "held-out": m.get(f"eval/loss/{d}/{e}"),
                  "held-out p_demo": m.get(f"eval/p_demo/{d}/{e}"),
                  "held-out greedy_match": m.get(f"eval/greedy_match/{d}/{e}")}
                 for d in DOMAINS for e in EFFORTS]
    own: dict[str, Any] = {
        "steps": cfg.steps,
        "tokens_seen": r.tokens_seen,
        "qat": True,
        "budget_scale": config.budget_scale,
        "eval/success_rate": _mean(r.evals, "success_rate"),
        "eval/mean_policy_tokens": _mean(r.evals, "mean_policy_tokens"),
        "base_model/success_rate": _mean(r.start_evals, "success_rate"),
        "base_model/mean_policy_tokens": _mean(r.start_evals, "mean_policy_tokens"),
        # Not the "sft_policy/success_rate" of an rl_specialist page: that is this policy re-scored on
        # the specialist's own, larger held-out set.
        "evaluation": f"sft_policy's own held-out evaluation: {plan.tasks_per_family} task(s) per family at each "
                      "effort (n per cell below); each rl_specialist partition re-scores sft_policy on its own held-out "
                      "tasks (its sft_policy/success_rate, n = sft_policy/n)",
        "success_by_domain_effort": dg.MetadataValue.md(markdown_table(success_rows(r.evals, r.start_evals,
                                                                                    "base_model"))),
        "success_by_harness": dg.MetadataValue.md(markdown_table([
            {"harness": h, "n": f["n"], "success": f["success_rate"], "unparseable": f["unparseable_rate"],
             "base_model success": base_harness.get(h, {}).get("success_rate")} for h, f in harness.items()])),
        "own_token_loss": dg.MetadataValue.md(markdown_table(loss_rows)),
        **{k: float(m[k]) for k in ("fit/loss", "eval/loss", "eval/p_demo", "eval/greedy_match",
                                    "train/first_loss", "train/final_loss",
                                    "perf/own_tokens_per_s", "perf/eval_wall_s") if k in m},
        "loss": sparkline([h.get("train/main", float("nan")) for h in r.history], "train/main",
                          f"train/main over {len(r.history)} steps"),
        "evals": dg.MetadataValue.json({"sft_policy": r.evals, "base_model": r.start_evals}),
    }
    return trained.materialize_result(own)


# ----------------------------------------------------------------------------------------------
# rl_tasks: the ladder

class RLTasksConfig(ScaledEpisodes):
    tasks_per_family: int | None = Field(default=None, ge=1, description="ladder tasks per family "
                                         "(default: the profile's, POSTTRAIN_SIZES)")
    samples: int | None = Field(default=None, ge=2, description="episodes per task (G)")

    @classmethod
    def profile_values(cls, profile: str) -> dict[str, Any]:
        sizes = POSTTRAIN_SIZES[profile]
        return {"tasks_per_family": sizes.ladder_tasks_per_family, "samples": sizes.ladder_samples}

    def check_fits(self, profile: str) -> None:
        from k3model.limits import check_episodes_fit
        filled = self.filled(profile)
        tasks, samples = filled.tasks_per_family, filled.samples
        if self.overridden("samples", profile):
            check_episodes_fit("samples", samples, samples * tasks, f"{samples} samples × {tasks} tasks of a family")
        if self.overridden("tasks_per_family", profile):
            check_episodes_fit("tasks_per_family", tasks, samples * tasks, f"{samples} samples × {tasks} tasks of a family")


def materialize_rl_tasks(context: dg.AssetExecutionContext, config: RLTasksConfig, profile: str) -> dg.MaterializeResult:
    import json

    from k3model.train.ladder import PASS_K, LadderConfig, LadderReport

    from assets.posttrain_tasks import measure_ladder_task

    tag_run(context, profile)
    refuse_unfit(context, config, profile, "rl_tasks")
    ups = require_upstreams(context, ["sft_policy", "tokenizer"], profile)
    sizes, config = POSTTRAIN_SIZES[profile], config.filled(profile)
    families = {"families": sizes.sft_families} if sizes.sft_families is not None else {}
    samples = config.samples
    if samples < PASS_K:
        context.log.warning(f"rl_tasks: {samples} samples per task, so the ladder selects on pass@{samples}, "
                            f"not pass@{PASS_K} (a stricter test: pass@k grows with k)")
    cfg = LadderConfig(tasks_per_family=config.tasks_per_family,
                       samples=samples, k=min(PASS_K, samples), rl_tasks_per_family=sizes.rl_tasks_per_family,
                       heldout_tasks_per_family=sizes.rl_eval_tasks_per_family, hard_tasks=sizes.rl_hard_tasks,
                       **families)
    ray = context.resources.ray
    t0 = time.perf_counter()
    out = ray.run(measure_ladder_task, str(ups["sft_policy"].path), str(ups["tokenizer"].path), cfg,
                  effort_specs(scaled_budgets(sizes.eval_budgets, config.budget_scale)), log=context.log.info,
                  **ray.placement(log=context.log.info))
    seconds = time.perf_counter() - t0
    ladder = out["json"]
    report = LadderReport.from_json(ladder)
    chosen: dict[str, dict[str, list]] = {}
    for cell in report.cells:
        splits = report.splits(cell.domain, cell.effort)
        chosen[f"{cell.domain}/{cell.effort}"] = {"rl": [(t.family, t.seed) for t in splits["rl"]],
                                                  "eval": [(t.family, t.seed) for t in splits["heldout"]]}
    ladder["tasks"] = chosen
    random_passes = report.random_passes()
    if random_passes:
        # Reported, never fixed here: a verifier a guesser passes is a bug in envs, not in the ladder.
        context.log.warning(f"rl_tasks: the random policy passed tasks of {random_passes}")
    expert_min = min((b["expert"][0] / b["expert"][1] for c in report.cells for b in c.baselines.values()
                      if b["expert"][1]), default=float("nan"))
    if expert_min < 1.0:
        context.log.warning(f"rl_tasks: the scripted expert failed some tasks (lowest split success {expert_min:.2f}): "
                            "the baselines table names the split")
    text = json.dumps(ladder, indent=1, sort_keys=True, default=list)
    from datagen.io import write_text
    path, sha = publish(context.resources.store.data_dir(profile, "rl_tasks"), "ladder.json",
                        lambda p: write_text(text, p))
    md = out["metadata"]
    mlflow = context.resources.mlflow
    where = out.get("where", {})  # device, GPU, Ray's resources for the task, node (ray_task.where_it_runs)
    with mlflow.start_run(context, params={"profile": profile, **dataclasses.asdict(cfg)},
                          tags={**profile_tags(profile), **where}) as run:
        mlflow.log_metrics(run.info.run_id, {f"ladder/{k}": float(v) for k, v in md.items()
                                             if isinstance(v, (int, float))})
        mlflow.client().log_artifact(run.info.run_id, str(path))
    rows = [{"domain": c.domain, "effort": c.effort, "selected": ", ".join(c.selected),
             "pass@1": c.pass_rate, f"pass@{cfg.k}": c.pass_at_k_rate, "greedy": c.greedy_rate,
             "in band": c.in_band, "informative": c.informative_frac,
             "rl tasks": len(chosen[f"{c.domain}/{c.effort}"]["rl"]),
             "held-out tasks": len(chosen[f"{c.domain}/{c.effort}"]["eval"])} for c in report.cells]
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(str(path)), "sha256": sha, "profile": profile,
        "selection": (f"pass@1 (T=1) in [{cfg.band[0]}, {cfg.band[1]}] and pass@{cfg.k} ≥ {cfg.pass_at_k_min}, "
                      f"{cfg.samples} samples × {cfg.tasks_per_family} tasks per family"),
        "ladder": dg.MetadataValue.md(out["table"]),
        "chosen": dg.MetadataValue.md(markdown_table(rows)),
        "baselines": dg.MetadataValue.md(out["baseline_table"]),
        "cells_in_band": sum(c.in_band for c in report.cells),
        "budget_scale": config.budget_scale,
        "random_passes": len(random_passes),
        "expert_min": expert_min,
        "pass_rates": dg.MetadataValue.json({k: v for k, v in md.items() if k.endswith("/pass_rate")}),
        "perf/wall_s": round(seconds, 3),
        "mlflow_run": dg.MetadataValue.url(mlflow.run_url(run)),
        **{k.removeprefix("k3/"): dg.MetadataValue.json(json.loads(v)) if k == "k3/ray_resources" else v
           for k, v in where.items()},
    }, data_version=dg.DataVersion(sha), tags=profile_tags(profile))


# ----------------------------------------------------------------------------------------------
# rl_specialist: nine partitions, trained concurrently

class RLSpecialistConfig(ScaledEpisodes):
    """Every specialist of the run; steps, group_size, groups_per_step and lr default to the profile's
    (POSTTRAIN_SIZES)."""
    steps: int | None = Field(default=None, ge=1, description="GRPO updates per specialist")
    group_size: int | None = Field(default=None, ge=2, description="episodes per prompt (G)")
    groups_per_step: int | None = Field(default=None, ge=1, description="informative groups per update (P)")
    lr: float | None = Field(default=None, gt=0)
    seed: int = Field(default=0, ge=0)
    retries: int = Field(default=1, ge=0, description="how often a failed specialist's Ray task is run again")
    ckpt_every: int = Field(default=0, ge=0, description="GRPO steps between a specialist's resume points (its "
                            "work dir's last/, which a rerun after a kill continues from); 0: four per run")
    retrain: bool = Field(default=False, description="train again a partition whose newest materialization was "
                          "trained from the same inputs by this code version (default: record that one again)")

    @classmethod
    def profile_values(cls, profile: str) -> dict[str, Any]:
        sizes = POSTTRAIN_SIZES[profile]
        return {"steps": sizes.rl_steps, "group_size": sizes.rl_group_size, "groups_per_step": sizes.rl_groups_per_step,
                "lr": sizes.rl_lr}

    def check_fits(self, profile: str) -> None:
        from k3model.limits import check_episodes_fit
        filled = self.filled(profile)
        g, p = filled.group_size, filled.groups_per_step
        what = f"group_size {g} × groups_per_step {p}, the first draw of a step, kept until its update"
        if self.overridden("group_size", profile):
            check_episodes_fit("group_size", g, g * p, what)
        if self.overridden("groups_per_step", profile):
            check_episodes_fit("groups_per_step", p, g * p, what)


def trained_before(context: dg.AssetExecutionContext, profile: str, partition: str, inputs_key: str,
                   code_version: str) -> tuple[dict[str, Any], str, str] | None:
    """(metadata, sha256, run id) of `partition`'s newest materialization when it was trained from
    the same inputs (`inputs_key`: config, upstreams' data versions, partition) by `code_version`
    and its checkpoint still verifies; else None."""
    from assets.lineage import Upstream, upstream_problem
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key(profile, "rl_specialist"), asset_partitions=[partition]), limit=1).records
    if not records:
        return None
    mat = records[0].event_log_entry.asset_materialization
    md = mat.metadata
    if ("inputs_key" not in md or md["inputs_key"].value != inputs_key or "path" not in md or "sha256" not in md
            or (mat.tags or {}).get("dagster/code_version") != code_version):
        return None
    up = Upstream(name=f"rl_specialist[{partition}]", path=Path(md["path"].value), data_version=md["sha256"].value,
                  run_id=records[0].run_id, metadata={"sha256": md["sha256"].value})
    if not up.path.exists() or upstream_problem(up) is not None:
        return None
    return dict(md), md["sha256"].value, records[0].run_id


def specialist_metadata(cfg, domain: str, effort: str, r) -> dict[str, Any]:
    """A trained specialist's own metadata (its task's PolicyResult `r`): its held-out scores beside
    sft_policy's on the same tasks, claim 3's paired figures, the reward curve, perf/rl/flops."""
    cell = f"{domain}/{effort}"
    mine, sft, hard = r.evals[cell], r.start_evals[cell], r.evals[f"{cell}/hard"]
    curve = [h.get("rl/success", float("nan")) for h in r.history]
    zero_var = [h["rl/frac_zero_variance"] for h in r.history if "rl/frac_zero_variance" in h]
    return {
        "domain": domain, "effort": effort, "steps": cfg.steps,
        "eval/success_rate": mine["success_rate"], "eval/ci95": f"[{mine['ci95_low']:.2f}, {mine['ci95_high']:.2f}]",
        "eval/n": mine["n"], "eval/mean_policy_tokens": mine["mean_policy_tokens"],
        "sft_policy/success_rate": sft["success_rate"], "sft_policy/mean_policy_tokens": sft["mean_policy_tokens"],
        "sft_policy/n": sft["n"],
        "sft_policy/evaluation": "sft_policy re-scored by this specialist's held-out evaluation (the same tasks and "
                                 "seeds as eval/): not the sft_policy page's own, smaller evaluation",
        # Claim 3's paired test (k3model.train.stats): tasks only the specialist / only sft_policy solved.
        **{k: mine[k] for k in ("paired/b", "paired/c", "paired/n") if k in mine},
        **{f"eval/{k}": v for k, v in mine.items() if k.startswith("pass_at_")},  # when scored with samples > 1
        **({"sft_policy/hard/success_rate": r.start_evals[f"{cell}/hard"]["success_rate"],
            "sft_policy/hard/n": r.start_evals[f"{cell}/hard"]["n"]} if f"{cell}/hard" in r.start_evals else {}),
        "gain": mine["success_rate"] - sft["success_rate"],
        # Claim 3's figure: the paired (Agresti–Min) 95 % interval of specialist − sft_policy on the
        # same tasks, Newcombe's (independent samples) when the pairs are not there.
        "gain/ci95": "[{1:+.2f}, {2:+.2f}]".format(
            *(paired_difference(mine["paired/b"], mine["paired/c"], mine["paired/n"]) if "paired/b" in mine
              else rate_difference(mine["successes"], mine["n"], sft["successes"], sft["n"]))),
        "eval/n_tasks": mine["n_tasks"], "eval/samples": mine["samples"], "eval/temperature": mine["temperature"],
        "eval/hard/success_rate": hard["success_rate"], "eval/hard/n": hard["n"],
        "eval/hard/mean_policy_tokens": hard["mean_policy_tokens"],
        "rl/frac_zero_variance": sum(zero_var) / len(zero_var) if zero_var else float("nan"),
        "reward_curve": sparkline(curve, "rl/success", f"rollout success over {len(curve)} steps"),
        "reward_by_step": dg.MetadataValue.json([round(v, 4) for v in curve]),
        **{k: float(v) for k, v in r.metrics.items() if k.startswith(("perf/", "rl/", "flops/")) and isinstance(v, (int, float))},
    }


def materialize_rl_specialists(context: dg.AssetExecutionContext, config: RLSpecialistConfig, profile: str):
    """The specialists of the run's partitions as concurrent Ray tasks. Each checkpoints every
    `ckpt_every` steps into a work dir keyed by its inputs, and is recorded as materialized as soon
    as it finishes (`assets.training.partition_materialization`): a rerun after a kill resumes each
    unfinished one from its last resume point, and one already trained from the same inputs by this
    code version is recorded again, not retrained (unless `retrain`)."""
    import json

    from k3model.train.grpo import GRPOConfig

    from assets.posttrain_tasks import train_specialist_task
    from assets.training import partition_materialization, partitioned_result, run_trainings

    tag_run(context, profile)
    refuse_unfit(context, config, profile, "rl_specialist")
    keys = list(context.partition_keys)
    try:
        cells = {pk: specialist_cell(pk) for pk in keys}
    except ValueError as e:
        raise dg.Failure(description=f"{profile}/rl_specialist: {e}", allow_retries=False) from e
    ups = require_upstreams(context, ["sft_policy", "rl_tasks", "tokenizer"], profile)
    sizes, config = POSTTRAIN_SIZES[profile], config.filled(profile)
    specs = effort_specs(scaled_budgets(sizes.eval_budgets, config.budget_scale))
    op = f"{profile}__rl_specialist"
    try:
        cfg = GRPOConfig(steps=config.steps, group_size=config.group_size, groups_per_step=config.groups_per_step,
                         lr=config.lr, seed=config.seed, ckpt_every=config.ckpt_every,
                         max_draw_factor=sizes.rl_max_draw_factor, **({"efforts": specs} if specs else {}))
    except ValueError as e:
        raise dg.Failure(description=f"invalid config for {profile}/rl_specialist (ops.{op}.config): {e}",
                         allow_retries=False) from e
    ladder = json.loads(Path(ups["rl_tasks"].path).read_text())

    jobs = {}
    for pk, (domain, effort) in cells.items():
        tasks = ladder["tasks"][f"{domain}/{effort}"]
        jobs[pk] = TrainingJob(
            profile=profile, name="rl_specialist", partition=pk, task=train_specialist_task,
            args=(cfg, str(ups["sft_policy"].path), str(ups["tokenizer"].path), domain, effort,
                  [tuple(t) for t in tasks["rl"]], [tuple(t) for t in tasks["eval"]],
                  specialist_scoring(profile, cfg.seed)),
            config=cfg, inputs=ups, log_every=cfg.log_every, retries=config.retries,
            params={"domain": domain, "effort": effort, "rl_tasks": len(tasks["rl"])},
            description=f"{profile} RL specialist {domain} at effort {effort}: GRPO from sft_policy, {cfg.steps} "
                        "steps on its rl_tasks cell",
            headline=lambda r: {"eval/success_rate": r.metrics.get("eval/success_rate", float("nan"))})
    # A partition the run's range holds but a killed run already finished (a range is a rectangle of
    # the domain × effort grid: k3 run's narrowed range can cover finished partitions too).
    done: dict[str, tuple[dict[str, Any], str]] = {}
    if not config.retrain:
        for pk, job in jobs.items():
            found = trained_before(context, profile, pk, job.inputs_key(), POSTTRAIN_CODE_VERSION)
            if found is not None:
                done[pk] = found[:2]
                context.log.info(f"{profile}/rl_specialist[{pk}]: already trained from the same inputs by this code "
                                 f"version (run {found[2][:8]}, {found[0]['path'].value}); recorded again, not "
                                 "retrained (rl_specialist.retrain=true trains it again)")
    todo = [pk for pk in keys if pk not in done]
    ray = context.resources.ray
    share = ray.placement(max(len(todo), 1), log=context.log.info)  # assets.ray_task.placement
    num_cpus, num_gpus = share["num_cpus"], share["num_gpus"]
    context.log.info(f"{profile}/rl_specialist: {len(todo)} specialist(s) to train ({', '.join(todo) or 'none'}), "
                     f"{cfg.steps} GRPO steps each (a resume point every {cfg.ckpt_every or max(cfg.steps // 4, 1)}), "
                     f"as concurrent Ray tasks of {num_cpus:g} CPU / {num_gpus:g} GPU")

    recorded: set[str] = set()

    def record(trained) -> None:
        # As each specialist finishes, while the others still train: a kill later loses none of it.
        pk = trained.job.partition
        metadata = trained.metadata({**specialist_metadata(cfg, *cells[pk], trained.result),
                                     "budget_scale": config.budget_scale})
        done[pk] = (metadata, trained.info.sha256)
        context.log_event(partition_materialization(context, profile, pk, metadata, trained.info.sha256,
                                                    POSTTRAIN_CODE_VERSION))
        recorded.add(pk)

    todo_jobs = [dataclasses.replace(jobs[pk], num_cpus=num_cpus, num_gpus=num_gpus) for pk in todo]
    outcomes = dict(zip(todo, run_trainings(context, todo_jobs, on_trained=record))) if todo else {}
    failed = {pk: o for pk, o in outcomes.items() if isinstance(o, BaseException)}
    # The 3 × 3 summary leads the metadata the step's end records (a partition recorded as it finished
    # carries its own only: the nine were not all there yet); a reused one's old summary is replaced.
    finished = {pk: done[pk] for pk in keys if pk in done}
    nine = _with_the_nine(context, profile, {pk: {k: v for k, v in md.items()
                                                  if k not in ("specialists_3x3", "plot/specialists")}
                                             for pk, (md, _) in finished.items()})
    yield from partitioned_result(context, profile, {pk: (nine[pk], sha) for pk, (_, sha) in finished.items()},
                                  failed, frozenset(recorded), POSTTRAIN_CODE_VERSION)


def _with_the_nine(context: dg.AssetExecutionContext, profile: str, own: dict[str, dict]) -> dict[str, dict]:
    """Every partition's metadata led by the nine side by side (assets.report.specialists_overview):
    the asset's page shows its newest partition only. A failure to draw them is logged, and the
    specialists are recorded without them."""
    from assets.lineage import run_id
    from assets.report import specialists_overview
    try:
        nine = specialists_overview(context.instance, profile, own,
                                    context.resources.store.report_dir(profile, "rl_specialist", run_id(context)))
    except Exception as e:  # noqa: BLE001 - a summary must not lose nine trained specialists
        context.log.warning(f"{profile}/rl_specialist: the 3 × 3 summary was not made ({type(e).__name__}: {e})")
        return own
    return {pk: {**nine, **md} for pk, md in own.items()}


# ----------------------------------------------------------------------------------------------
# Builders

def build(profile: str) -> list[dg.AssetsDefinition]:
    """The post-training assets of `profile`."""
    common = dict(key_prefix=[profile], group_name=group(profile, GROUP), tags=profile_tags(profile))

    @dg.asset(name="sft_data", kinds={"python", "parquet"}, deps=[key(profile, "tokenizer")],
              code_version=source_tree_sha256(packages=("datagen", "envs"))[:12],
              required_resource_keys={"store", "mlflow"}, **common,
              description="SFT demonstrations from the scripted experts of all three domains, in the training "
                          "harnesses, at three efforts (low answers at once; high and max think first), loss "
                          "on the model's own tokens; a held-out table of other task seeds beside it.")
    def sft_data(context: dg.AssetExecutionContext,
                 config: SFTDataAssetConfig.for_profile(profile)) -> dg.MaterializeResult:
        return materialize_sft_data(context, config, profile)

    @dg.asset(pool="gpu", name="sft_policy", kinds={"pytorch", "ray"},
              deps=[key(profile, n) for n in ("base_model", "sft_data", "tokenizer")],
              code_version=POSTTRAIN_CODE_VERSION, required_resource_keys=RESOURCES, **common,
              description="The SFT cold start: base_model fine-tuned on sft_data with QAT on from the first "
                          "step; held-out task success per (domain, effort) and per harness beside base_model's.")
    def sft_policy(context: dg.AssetExecutionContext, config: SFTPolicyConfig.for_profile(profile)) -> dg.MaterializeResult:
        return materialize_sft_policy(context, config, profile)

    @dg.asset(pool="gpu", name="rl_tasks", kinds={"python", "json", "ray"}, deps=[key(profile, n) for n in ("sft_policy", "tokenizer")],
              code_version=POSTTRAIN_CODE_VERSION, required_resource_keys=RESOURCES, **common,
              description="The RL task ladder: sft_policy's pass@1, pass@8 and greedy success per task family and "
                          "effort, and per (domain, effort) the families with pass@1 in 0.2–0.6 and pass@8 ≥ 0.8 "
                          "(pre-registered) the specialist trains on, with its RL prompts and held-out tasks and a "
                          "random and the scripted expert policy's success on each split.")
    def rl_tasks(context: dg.AssetExecutionContext, config: RLTasksConfig.for_profile(profile)) -> dg.MaterializeResult:
        return materialize_rl_tasks(context, config, profile)

    @dg.asset(pool="gpu", name="rl_specialist", kinds={"pytorch", "ray"},
              deps=[key(profile, n) for n in ("sft_policy", "rl_tasks", "tokenizer")],
              partitions_def=SPECIALIST_PARTITIONS, backfill_policy=dg.BackfillPolicy.single_run(),
              code_version=POSTTRAIN_CODE_VERSION, required_resource_keys=RESOURCES, **common,
              description="Nine GRPO specialists, domain × effort, one partition each, trained from sft_policy on "
                          "their rl_tasks cell. A run of several partitions trains them as concurrent Ray tasks "
                          "(one step: BackfillPolicy.single_run).")
    def rl_specialist(context: dg.AssetExecutionContext, config: RLSpecialistConfig.for_profile(profile)):
        yield from materialize_rl_specialists(context, config, profile)

    return [sft_data, sft_policy, rl_tasks, rl_specialist]
