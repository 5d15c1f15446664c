"""Distillation assets: the MOPD student and the cross-harness transfer folds (DESIGN.md §1, §5 claims
4 and 7; issue 19).

    sft_policy ─┬─> mopd_student      (the rl_specialist partitions of its routes are its teachers,
    rl_tasks ───┤                      all nine by default; rl_tasks' ladder its prompts and held-out
                │                      tasks per cell)
    rl_specialist[domain × effort] ─┘
    sft_policy ──> cross_harness      (GRPO arms per fold: four harnesses vs one, the fifth held out)

`build(profile)` makes them (keys `<profile>/mopd_student`, `<profile>/cross_harness`, group
`<profile>_distillation`), each through the training adapter (`assets.training`):

- `mopd_student`: `k3model.train.mopd.train` from sft_policy, each prompt routed by (domain, effort)
  to that rl_specialist partition, on the rl_tasks ladder's prompts (the routes: `domains` × `efforts`
  of its config, all nine by default; only their partitions need to exist); then the student is played on
  each cell's held-out tasks with the budgets its specialist was evaluated with (the specialist's
  own figures are reused; a teacher without them is played here). Metadata: the teacher-retention
  matrix (student ÷ teacher success, 95 % interval, the ≥ 90 % target per cell), tokens per answer
  per effort, the KL to each teacher over training, the sampled estimators' bias and variance
  against the exact KL, counted FLOPs; the manifest names its teachers by checkpoint sha256. A cell
  outside the routes is not distilled: absent from the matrix (claim 4 reads only the cells present).
  With `control` on, the equal-compute generalist GRPO run (`k3model.train.control`) is trained on
  the specialists' + MOPD's counted FLOPs and evaluated on the same cells; `control/verdict` (pooled
  student − generalist, Newcombe 95 %) reads "underpowered" where the interval holds 0 and
  `control/power` (at a true ±`control/effect`) is < 0.8.
- `cross_harness`: per fold (held-out harness), a general arm (GRPO on the fold's training
  harnesses) and a single-harness arm (one of them, same config and budget), concurrent Ray tasks;
  each arm evaluated in its harnesses and in the held-out one. Metadata per fold: held-out ÷
  in-harness success with its 95 % interval for both arms, per-harness unparseable-action rates.
"""


import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import dagster as dg
from pydantic import Field, field_validator

from assets.config_bounds import AssetConfig, ScaledEpisodes, refuse_unfit
from assets.claims import rate_difference
from assets.display import inline_png, markdown_table, sparkline
from assets.distill_tasks import evaluate_sft_transfer_task, train_mopd_task, train_transfer_arm_task
from assets.lineage import Upstream, group, key, profile_tags, require_upstreams, tag_run, verify_upstreams
from assets.plots import retention_heatmap
from assets.posttrain import POSTTRAIN_CODE_VERSION
from assets.training import TrainingJob, run_arms, run_training
from k3model.train.control import CONTROL_EFFECT
from k3model.train.effort import DOMAINS, EFFORTS, effort_specs, scaled_budgets
from k3model.train.recipes import DISTILL_SIZES, POSTTRAIN_SIZES, TRANSFER_EVAL_SEED, specialist_scoring
from k3model.train.stats import POWER_TARGET, newcombe_power

GROUP = "distillation"
RESOURCES = {"store", "mlflow", "ray"}
RETENTION_TARGET = 0.9
TRANSFER_TARGET = 0.8




def specialist_partitions(context: dg.AssetExecutionContext, profile: str,
                          routes: Sequence[tuple[str, str]]) -> dict[str, Upstream]:
    """The newest materialization of the rl_specialist partition ("domain|effort") of each of
    `routes`, in their order; a Failure naming each missing one."""
    asset = key(profile, "rl_specialist")
    found: dict[str, Upstream] = {}
    missing = []
    for d, e in routes:
        pk = f"{d}|{e}"
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset, asset_partitions=[pk]), limit=1).records
        mat = records[0].event_log_entry.asset_materialization if records else None
        if mat is None or "path" not in mat.metadata:
            missing.append(pk)
            continue
        found[pk] = Upstream(name=f"rl_specialist/{d}/{e}", path=Path(mat.metadata["path"].value),
                             data_version=(mat.tags or {}).get("dagster/data_version", ""),
                             run_id=records[0].run_id, metadata={k: v.value for k, v in mat.metadata.items()})
    if missing:
        raise dg.Failure(description=f"{profile}/mopd_student needs the teacher of each of its {len(routes)} "
                                     f"route(s): rl_specialist partition(s) {', '.join(missing)} have not been "
                                     f"materialized for profile {profile!r}. Materialize them first (`k3 run "
                                     f"--profile {profile} --select '*rl_specialist' --partition "
                                     f"'{','.join(missing)}'`), or narrow the teachers with mopd_student.domains / "
                                     "mopd_student.efforts", allow_retries=False)
    verify_upstreams("mopd_student", found, profile)
    return found


# ----------------------------------------------------------------------------------------------
# mopd_student

class MOPDStudentConfig(ScaledEpisodes):
    """The distillation; steps, episodes_per_step and lr default to the profile's (DISTILL_SIZES)."""
    seed: int = Field(default=0, ge=0)
    steps: int | None = Field(default=None, ge=1)
    episodes_per_step: int | None = Field(default=None, ge=1, description="student episodes per update, "
                                          "round-robin over the (domain, effort) routes")
    lr: float | None = Field(default=None, gt=0)
    outcome_coef: float = Field(default=0.0, ge=0, description="α on the outcome-reward advantage (0: pure "
                                "distillation; > 0 needs samples_per_task ≥ 2)")
    samples_per_task: int = Field(default=1, ge=1)
    log_every: int = Field(default=2, ge=1)
    control: bool = Field(default=False, description="also train the equal-compute generalist GRPO control "
                          "(needs the specialists' counted FLOPs in their metadata, `flops/total`)")
    domains: list[str] | None = Field(default=None, min_length=1, description="the domains distilled (None: all "
                                      f"of {', '.join(DOMAINS)}); the routes are domains × efforts, each route's "
                                      "rl_specialist partition its teacher, and only those partitions must exist")
    efforts: list[str] | None = Field(default=None, min_length=1, description="the efforts distilled (None: all "
                                      f"of {', '.join(EFFORTS)}); e.g. domains [\"general_tasks\"] with efforts "
                                      "[\"low\"] distils from the one partition general_tasks|low")

    @field_validator("domains", "efforts")
    @classmethod
    def _known_once(cls, value: list[str] | None, info) -> list[str] | None:
        choices = DOMAINS if info.field_name == "domains" else EFFORTS
        for v in value or ():
            if v not in choices:
                raise ValueError(f"unknown {info.field_name[:-1]} {v!r}: choose one of {', '.join(choices)}")
            if value.count(v) > 1:
                raise ValueError(f"{info.field_name} names {v!r} twice (a route would be distilled twice as often)")
        return value

    @classmethod
    def profile_values(cls, profile: str) -> dict[str, Any]:
        sizes = DISTILL_SIZES[profile]
        return {"steps": sizes.mopd_steps, "episodes_per_step": sizes.mopd_episodes_per_step, "lr": sizes.mopd_lr}

    def check_fits(self, profile: str) -> None:
        from k3model.limits import check_episodes_fit
        e, k = self.filled(profile).episodes_per_step, self.samples_per_task
        what = f"episodes_per_step {e} × samples_per_task {k}, kept until the step's update"
        if self.overridden("episodes_per_step", profile):
            check_episodes_fit("episodes_per_step", e, e * k, what)
        check_episodes_fit("samples_per_task", k, e * k, what)


def retention_rows(kept: dict[str, dict]) -> list[dict[str, Any]]:
    rows = []
    for cell, r in kept.items():
        domain, effort = cell.split("/")
        rows.append({"domain": domain, "effort": effort, "n": r["n"], "student": r["student"],
                     "teacher": r["teacher"],
                     "student ÷ teacher": r["retention"] if r["retention"] is not None else "undefined (teacher 0)",
                     "ci95": f"[{r['ci95_low']:.2f}, {r['ci95_high']:.2f}]" if r["retention"] is not None else "",
                     f"≥ {RETENTION_TARGET:.0%}": ("yes" if r["retention"] >= RETENTION_TARGET else "no")
                     if r["retention"] is not None else "n/a",
                     "tokens/answer (student, teacher)": f"{r['student_tokens']:.0f}, {r['teacher_tokens']:.0f}"})
    return rows


def materialize_mopd_student(context: dg.AssetExecutionContext, config: MOPDStudentConfig,
                             profile: str) -> dg.MaterializeResult:
    from k3model.train.grpo import GRPOConfig
    from k3model.train.mopd import MOPDConfig

    tag_run(context, profile)
    refuse_unfit(context, config, profile, "mopd_student")
    sizes, config = DISTILL_SIZES[profile], config.filled(profile)
    try:
        cfg = MOPDConfig(seed=config.seed, steps=config.steps, episodes_per_step=config.episodes_per_step,
                         lr=config.lr, outcome_coef=config.outcome_coef,
                         samples_per_task=config.samples_per_task,
                         specs=effort_specs(scaled_budgets(sizes.mopd_budgets, config.budget_scale)),
                         log_every=config.log_every, domains=tuple(config.domains or DOMAINS),
                         efforts=tuple(config.efforts or EFFORTS))
    except ValueError as e:
        raise dg.Failure(description=f"invalid config for {profile}/mopd_student "
                                     f"(ops.{profile}__mopd_student.config): {e}", allow_retries=False) from e
    ups = require_upstreams(context, ["sft_policy", "rl_tasks", "tokenizer"], profile)
    teachers = specialist_partitions(context, profile, cfg.routes)
    # The teachers' figures are reused below: the student must be scored at their budgets.
    other_scale = {pk: t.metadata.get("budget_scale", 1.0) for pk, t in teachers.items()
                   if t.metadata.get("budget_scale", 1.0) != config.budget_scale}
    if other_scale:
        raise dg.Failure(description=f"{profile}/mopd_student: budget_scale {config.budget_scale}, but rl_specialist "
                                     + ", ".join(f"{pk} was evaluated at {v}" for pk, v in other_scale.items())
                                     + ": set mopd_student.budget_scale to the teachers' (or retrain them at this one)",
                         allow_retries=False)
    ladder = json.loads(Path(ups["rl_tasks"].path).read_text())
    cells = {pk: ladder["tasks"][pk.replace("|", "/")] for pk in teachers}
    # The specialists' own held-out evaluation (same tasks, same budgets): reused, not replayed.
    figures = {}
    for pk, t in teachers.items():
        m = t.metadata
        if all(k in m for k in ("eval/success_rate", "eval/n", "eval/mean_policy_tokens")):
            figures[pk] = {"success_rate": m["eval/success_rate"], "n": int(m["eval/n"]),
                           "successes": round(m["eval/success_rate"] * m["eval/n"]),
                           "mean_policy_tokens": m["eval/mean_policy_tokens"]}
    specs = effort_specs(scaled_budgets(POSTTRAIN_SIZES[profile].eval_budgets, config.budget_scale))
    spec_flops = [t.metadata.get("flops/total") for t in teachers.values()]
    specialist_flops = sum(spec_flops) if all(isinstance(f, (int, float)) for f in spec_flops) else None
    control_cfg = None
    if config.control:
        if specialist_flops is None:
            raise dg.Failure(description=f"{profile}/mopd_student: control=True needs each rl_specialist's counted "
                                         "FLOPs (`flops/total` in its metadata), which "
                                         + ", ".join(p for p, t in teachers.items() if "flops/total" not in t.metadata)
                                         + " lack", allow_retries=False)
        sizes_rl = POSTTRAIN_SIZES[profile]
        control_cfg = GRPOConfig(group_size=sizes_rl.rl_group_size, groups_per_step=sizes_rl.rl_groups_per_step,
                                 lr=sizes_rl.rl_lr, seed=config.seed, **({"efforts": specs} if specs else {}))
    if len(teachers) < len(DOMAINS) * len(EFFORTS):
        context.log.info(f"{profile}/mopd_student: distilling {len(teachers)} of the {len(DOMAINS) * len(EFFORTS)} "
                         f"(domain, effort) routes ({', '.join(teachers)}; mopd_student.domains/efforts): the other "
                         "cells are not distilled and not evaluated")
    context.log.info(f"{profile}/mopd_student: {cfg.steps} steps × {cfg.episodes_per_step} student episodes routed "
                     f"to {len(teachers)} teachers on the rl_tasks prompts; then the student on each cell's held-out "
                     f"tasks ({len(figures)} teacher evaluation(s) reused from rl_specialist)")

    def report(result, mlflow_run_id: str, report_dir) -> dict[str, Any]:
        mlflow = context.resources.mlflow
        mlflow.log_rows(mlflow_run_id, retention_rows(result.retention), "eval/teacher_retention.json")
        heatmap = retention_heatmap({c: k["retention"] for c, k in result.retention.items()},
                                    Path(report_dir) / "teacher_retention.png")
        mlflow.client().log_artifact(mlflow_run_id, str(heatmap), "plots")
        return {"plot/teacher_retention": inline_png(heatmap, "Teacher retention: student / teacher success")}

    ray = context.resources.ray
    inputs = {**ups, **{t.name: t for t in teachers.values()}}
    trained = run_training(context, TrainingJob(
        profile=profile, name="mopd_student", task=train_mopd_task,
        args=(cfg, str(ups["sft_policy"].path), {pk: str(t.path) for pk, t in teachers.items()},
              str(ups["tokenizer"].path), cells, specs, figures, control_cfg, specialist_flops,
              specialist_scoring(profile, config.seed)),
        config=cfg, inputs=inputs, log_every=cfg.log_every,
        **ray.placement(log=context.log.info),
        params={"control": config.control, "teacher_evals_reused": len(figures)},
        description=f"{profile} MOPD student: sft_policy distilled on-policy from {teacher_count(len(teachers))} "
                    "rl_specialist teachers (routed by domain × effort), one checkpoint for "
                    + ("every effort" if set(cfg.efforts) == set(EFFORTS) else f"effort(s) {', '.join(cfg.efforts)}"),
        headline=lambda r: {k: r.metrics[k] for k in ("eval/success_rate", "eval/retention_min") if k in r.metrics},
        report=report))
    # The student is what `k3 serve` serves: `models:/k3-<profile>-mopd_student@champion`.
    context.resources.mlflow.client().set_registered_model_alias(trained.version.name, "champion",
                                                                 trained.version.version)
    return trained.materialize_result({**mopd_metadata(trained.result, cfg, teachers, specialist_flops),
                                        "budget_scale": config.budget_scale})


def teacher_count(n: int) -> str:
    """How many teachers, in words: "the nine" when every (domain, effort) route is distilled."""
    nine = len(DOMAINS) * len(EFFORTS)
    return "the nine" if n == nine else f"{n} of the nine"


def mopd_metadata(r, cfg, teachers: dict[str, Upstream], specialist_flops: float | None) -> dict[str, Any]:
    kept = r.retention
    ratios = {c: k["retention"] for c, k in kept.items()}
    defined = [v for v in ratios.values() if v is not None]
    hist = r.history
    kl_rows = []
    for pk in teachers:
        name = "kl/" + pk.replace("|", "/")
        values = [h[name] for h in hist if name in h]
        kl_rows.append({"teacher": pk, "sha256": r.teacher_manifest[pk]["sha256"][:12], "steps seen": len(values),
                        "KL first": values[0] if values else None, "KL last": values[-1] if values else None})
    tokens = {e: [f["mean_policy_tokens"] for c, f in r.evals.items() if c.endswith("/" + e)] for e in EFFORTS}
    own: dict[str, Any] = {
        "steps": cfg.steps,
        "teacher_retention": dg.MetadataValue.md(markdown_table(retention_rows(kept))),
        "retention/min": min(defined) if defined else "undefined",
        "retention/cells_at_target": sum(v >= RETENTION_TARGET for v in defined),
        "retention/cells_defined": len(defined),
        "retention/target": RETENTION_TARGET,
        "retention_matrix": dg.MetadataValue.json(kept),
        "eval/success_rate": r.metrics.get("eval/success_rate"),
        **{f"tokens_per_answer/{e}": sum(v) / len(v) for e, v in tokens.items() if v},
        **{f"train/tokens_per_answer/{e}": sum(h[f"rollout/tokens_per_answer/{e}"] for h in hist
                                               if f"rollout/tokens_per_answer/{e}" in h)
           / max(sum(f"rollout/tokens_per_answer/{e}" in h for h in hist), 1) for e in cfg.efforts},
        "kl_to_each_teacher": dg.MetadataValue.md(markdown_table(kl_rows)),
        "kl_exact": sparkline([h.get("kl/exact", float("nan")) for h in hist], "kl/exact",
                              f"exact reverse KL to the routed teacher over {len(hist)} steps"),
        **{k: float(v) for k, v in r.metrics.items() if k.startswith(("kl/", "mopd/"))},
        "teachers": dg.MetadataValue.json(r.teacher_manifest),
        **{f"flops/{k}": v for k, v in r.flops.items()},
    }
    if specialist_flops is not None:
        own["flops/specialists_rl"] = specialist_flops
    # A subset of the routes (mopd_student.domains/efforts): the cells left out, by name.
    left_out = [f"{d}/{e}" for d in DOMAINS for e in EFFORTS if f"{d}|{e}" not in teachers]
    if left_out:
        own["not_distilled"] = ", ".join(left_out)
    if r.control is not None:
        c = r.control
        ctl = sum(f["success_rate"] for f in c["evals"].values()) / max(len(c["evals"]), 1)
        s_student, n_student = (sum(e[f] for e in r.evals.values()) for f in ("successes", "n"))
        s_control, n_control = (sum(e[f] for e in c["evals"].values()) for f in ("successes", "n"))
        # Pooled over every cell's episodes, student − generalist with Newcombe's 95 % interval: a
        # verdict only when the interval excludes 0 (two noisy means differ by chance otherwise), and
        # beside it the power to see a true ±CONTROL_EFFECT at the generalist's pooled rate: an interval
        # that holds 0 says nothing when that power is < 0.8.
        d, lo, hi = rate_difference(s_student, n_student, s_control, n_control)
        power = newcombe_power(s_control / n_control, CONTROL_EFFECT, n_student, n_control)
        at = f"(power {power:.2f} at ±{CONTROL_EFFECT * 100:.0f} points)"
        verdict = ("MOPD consolidates better" if lo > 0 else "the generalist consolidates better" if hi < 0 else
                   f"no difference at 95 % {at}" if power >= POWER_TARGET else f"underpowered {at}")
        own.update({"control/success_rate": ctl, "control/flops": c["flops"]["total"], "control/budget": c["budget"],
                    "control/turns": len(c["turns"]),
                    "control/pooled_difference": f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]", "control/verdict": verdict,
                    "control/power": power, "control/effect": CONTROL_EFFECT,
                    "control/evals": dg.MetadataValue.json(c["evals"])})
    return own


# ----------------------------------------------------------------------------------------------
# cross_harness

@dataclass(frozen=True)
class ArmConfig:
    """One arm of one fold: what the training adapter hashes into its inputs key and logs as params."""
    grpo: Any  # GRPOConfig
    held_out: str
    arm: str
    harnesses: tuple[str, ...]
    domain: str
    effort: str


class CrossHarnessConfig(ScaledEpisodes):
    """The transfer folds; folds and steps default to the profile's (DISTILL_SIZES)."""
    seed: int = Field(default=0, ge=0)
    folds: list[str] | None = Field(default=None, min_length=1, description="held-out harness of each fold (default: the "
                                    "profile's); the single-harness control trains on the fold's first style")
    steps: int | None = Field(default=None, ge=1, description="GRPO steps of each arm")
    log_every: int = Field(default=1, ge=1)

    @classmethod
    def profile_values(cls, profile: str) -> dict[str, Any]:
        sizes = DISTILL_SIZES[profile]
        return {"folds": list(sizes.folds), "steps": sizes.transfer_steps}


def materialize_cross_harness(context: dg.AssetExecutionContext, config: CrossHarnessConfig,
                              profile: str) -> dg.MaterializeResult:
    from datagen.sft import HELD_OUT_HARNESS, SFT_FAMILIES
    from k3model.train.grpo import GRPOConfig
    from k3model.train.ladder import RL_SEED_BASE, domain_families, tasks_of
    from k3model.train.transfer import FoldResult, fold_harnesses

    tag_run(context, profile)
    sizes, config = DISTILL_SIZES[profile], config.filled(profile)
    folds = tuple(config.folds)
    try:
        specs = effort_specs(scaled_budgets(sizes.transfer_budgets, config.budget_scale))
        grpo = GRPOConfig(group_size=sizes.transfer_group_size, groups_per_step=sizes.transfer_groups_per_step,
                          steps=config.steps, seed=config.seed, log_every=config.log_every,
                          **({"efforts": specs} if specs else {}))
        arms = [(h, name, hs) for h in folds for name, hs in zip(("general", "single"),
                                                               (fold_harnesses(h)[0], (fold_harnesses(h)[1],)))]
    except ValueError as e:
        raise dg.Failure(description=f"invalid config for {profile}/cross_harness "
                                     f"(ops.{profile}__cross_harness.config): {e}", allow_retries=False) from e
    ups = require_upstreams(context, ["sft_policy", "tokenizer"], profile)
    domain, effort = sizes.transfer_domain, sizes.transfer_effort
    # The domain's families SFT was shown (the profile's), as the specialists' ladder uses.
    families = domain_families(domain, POSTTRAIN_SIZES[profile].sft_families or SFT_FAMILIES)
    per = -(-max(sizes.transfer_rl_tasks, sizes.transfer_eval_tasks) // len(families))
    rl_tasks = [(t.family, t.seed) for t in tasks_of(families, per, RL_SEED_BASE)[: sizes.transfer_rl_tasks]]
    eval_tasks = [(t.family, t.seed) for t in tasks_of(families, per, TRANSFER_EVAL_SEED)[: sizes.transfer_eval_tasks]]
    context.log.info(f"{profile}/cross_harness: {len(folds)} fold(s) × 2 arms of {grpo.steps} GRPO steps on "
                     f"{domain} at {effort}; {len(eval_tasks)} held-out tasks per evaluation")
    share = context.resources.ray.placement(len(arms), log=context.log.info)  # assets.ray_task.placement
    jobs = [TrainingJob(
        profile=profile, name="cross_harness", partition=f"{h}|{name}", task=train_transfer_arm_task,
        args=(grpo, str(ups["sft_policy"].path), str(ups["tokenizer"].path), name, domain, effort, tuple(hs), h,
              rl_tasks, eval_tasks, specs),
        config=ArmConfig(grpo, h, name, tuple(hs), domain, effort), inputs=ups, log_every=grpo.log_every,
        **share,
        description=f"{profile} cross-harness fold (held out: {h}), {name} arm: GRPO on {', '.join(hs)}",
        headline=lambda r: {"held_out_success": r.arm.held_out["success_rate"],
                            "in_harness_success": r.arm.in_harness["success_rate"]})
        for h, name, hs in arms]
    by_arm = run_arms(context, jobs, f"{profile}/cross_harness")
    # sft_policy scored as the arms are (same tasks, harnesses and budgets): claim 7 forms the RL gain.
    ray = context.resources.ray
    sft = ray.run(evaluate_sft_transfer_task, str(ups["sft_policy"].path), str(ups["tokenizer"].path), folds, effort,
                  eval_tasks, specs, log=context.log.info, **ray.placement(log=context.log.info))
    results = []
    for h in folds:
        g, s = by_arm[f"{h}|general"].result.arm, by_arm[f"{h}|single"].result.arm
        results.append(FoldResult(h, domain, effort, g, s, sft_saw_held_out=h != HELD_OUT_HARNESS, sft=sft[h]))
        context.log.info(f"{profile}/cross_harness, held out {h}: sft_policy {sft[h]['in_harness']['success_rate']:.2f} "
                         f"in-harness, {sft[h]['held_out']['success_rate']:.2f} held out; general arm "
                         f"{g.in_harness['success_rate']:.2f}, {g.held_out['success_rate']:.2f}")
    rows = []
    own: dict[str, Any] = {"folds": ",".join(folds), "steps": grpo.steps, "target": TRANSFER_TARGET,
                           "budget_scale": config.budget_scale}
    for fold in results:
        rows.append({"held out": fold.held_out, "arm": "sft_policy", "trained on": "(SFT)",
                     "in-harness": fold.sft["in_harness"]["success_rate"],
                     "held-out": fold.sft["held_out"]["success_rate"], "held-out ÷ in-harness": "", "ci95": "",
                     "unparseable (in, held-out)": f"{fold.sft['in_harness']['unparseable_rate']:.2f}, "
                                                   f"{fold.sft['held_out']['unparseable_rate']:.2f}",
                     "SFT saw held-out": fold.sft_saw_held_out})
        for arm in (fold.general, fold.single):
            ratio, lo, hi = arm.transfer()
            rows.append({"held out": fold.held_out, "arm": arm.name, "trained on": ", ".join(arm.harnesses),
                         "in-harness": arm.in_harness["success_rate"], "held-out": arm.held_out["success_rate"],
                         "held-out ÷ in-harness": ratio if ratio is not None else "undefined",
                         "ci95": f"[{lo:.2f}, {hi:.2f}]" if ratio is not None else "",
                         "unparseable (in, held-out)": f"{arm.in_harness['unparseable_rate']:.2f}, "
                                                       f"{arm.held_out['unparseable_rate']:.2f}",
                         "SFT saw held-out": fold.sft_saw_held_out})
        own.update({f"{fold.held_out}/{k}": v for k, v in fold.as_metadata().items()})
    own["transfer"] = dg.MetadataValue.md(markdown_table(rows))
    own["arms"] = dg.MetadataValue.json({p: {"checkpoint": str(o.checkpoint), "sha256": o.info.sha256,
                                             "model_version": f"{o.version.name}/{o.version.version}"}
                                         for p, o in by_arm.items()})
    return by_arm[f"{folds[0]}|general"].materialize_result(own)


# ----------------------------------------------------------------------------------------------
# Builders

def build(profile: str) -> list[dg.AssetsDefinition]:
    """The distillation assets of `profile`."""
    common = dict(key_prefix=[profile], group_name=group(profile, GROUP), tags=profile_tags(profile),
                  code_version=POSTTRAIN_CODE_VERSION, required_resource_keys=RESOURCES, kinds={"pytorch", "ray"})

    @dg.asset(pool="gpu", name="mopd_student",
              deps=[key(profile, n) for n in ("sft_policy", "rl_tasks", "rl_specialist", "tokenizer")],
              description="One checkpoint for every effort: sft_policy distilled on-policy from the nine "
                          "rl_specialist teachers (each prompt routed by domain × effort; per-token reverse-KL "
                          "advantage; config domains/efforts narrow them to a subset); teacher-retention matrix, "
                          "KL to each teacher, counted FLOPs.", **common)
    def mopd_student(context: dg.AssetExecutionContext,
                     config: MOPDStudentConfig.for_profile(profile)) -> dg.MaterializeResult:
        return materialize_mopd_student(context, config, profile)

    @dg.asset(pool="gpu", name="cross_harness", deps=[key(profile, n) for n in ("sft_policy", "tokenizer")],
              description="Claim 7: GRPO on four harness styles vs on one (same budget), each evaluated on the "
                          "held-out fifth; held-out ÷ in-harness success with 95 % intervals, unparseable rates.",
              **common)
    def cross_harness(context: dg.AssetExecutionContext,
                      config: CrossHarnessConfig.for_profile(profile)) -> dg.MaterializeResult:
        return materialize_cross_harness(context, config, profile)

    return [mopd_student, cross_harness]
