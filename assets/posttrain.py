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

Sizes per profile are in `SIZES` (smoke: seconds per asset; tiny: minutes). The held-out evaluation
tasks come from `EVAL_SEED`, far from the RL prompts' seeds and from the SFT demonstrations'
(`datagen.sft.SFT_TASK_SEED_BASE`), so no evaluated task was trained on.
"""


import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from assets.data import _result as data_result
from assets.lineage import group, key, markdown_table, profile_tags, require_upstreams, sparkline, tag_run
from assets.storage import publish
from assets.tasks import EvalPlan, per_harness, train_sft_task
from assets.training import TrainingJob, run_training
from k3model.checkpoint import source_tree_sha256

POSTTRAIN_CODE_VERSION = source_tree_sha256(packages=("k3model", "kernels", "datagen", "envs"))[:12]
DOMAINS = ("general_tasks", "general_agents", "coding_agents")
EFFORTS = ("low", "high", "max")
GROUP = "posttraining"
RESOURCES = {"store", "mlflow", "ray"}
# Held-out evaluation tasks: envs.task_set(domain, n, EVAL_SEED), below the SFT seeds (1 000 000 +)
# and above the RL prompts' (the ladder draws from 0 up).
EVAL_SEED = 500_000


@dataclass(frozen=True)
class PosttrainSizes:
    """How much post-training a profile does."""
    sft_families: tuple[str, ...] | None  # None: every easy and medium family
    sft_tasks_per_family: int
    sft_heldout_tasks_per_family: int
    sft_max_tokens: int
    sft_steps: int
    sft_batch_size: int
    sft_lr: float
    eval_tasks_per_domain: int
    # (effort, episode budget, turn cap) in policy tokens; None: k3model.train.grpo.EFFORT_SPECS
    eval_budgets: tuple[tuple[str, int, int], ...] | None = None


SIZES: dict[str, PosttrainSizes] = {
    # The shortest family of each domain, one task each, and a few generated tokens per episode:
    # every asset in seconds, so the lineage runs inside the test suite.
    "smoke": PosttrainSizes(sft_families=("arith_word", "slack_post", "write_function"), sft_tasks_per_family=1,
                            sft_heldout_tasks_per_family=1, sft_max_tokens=4096, sft_steps=2, sft_batch_size=2,
                            sft_lr=1e-3, eval_tasks_per_domain=1,
                            eval_budgets=(("low", 8, 4), ("high", 8, 4), ("max", 8, 4))),
    "tiny": PosttrainSizes(sft_families=None, sft_tasks_per_family=8, sft_heldout_tasks_per_family=1,
                           sft_max_tokens=4096, sft_steps=120, sft_batch_size=4, sft_lr=1e-3,
                           eval_tasks_per_domain=4),
    "small": PosttrainSizes(sft_families=None, sft_tasks_per_family=64, sft_heldout_tasks_per_family=4,
                            sft_max_tokens=16384, sft_steps=2000, sft_batch_size=16, sft_lr=3e-4,
                            eval_tasks_per_domain=32),
}


def eval_plan(profile: str, tasks_per_domain: int | None = None, domains: tuple[str, ...] = DOMAINS,
              efforts: tuple[str, ...] = EFFORTS) -> EvalPlan:
    """The held-out evaluation of `profile`: the same tasks for every policy that is compared."""
    from datagen.sft import SFT_DIFFICULTIES
    sizes = SIZES[profile]
    return EvalPlan(domains=domains, efforts=efforts, tasks_per_domain=tasks_per_domain or sizes.eval_tasks_per_domain,
                    seed=EVAL_SEED, difficulties=SFT_DIFFICULTIES, budgets=sizes.eval_budgets)


def check_cell(domain: str, effort: str) -> None:
    """A ValueError naming the valid values, for an unknown domain or effort."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}: choose one of {', '.join(DOMAINS)}")
    if effort not in EFFORTS:
        raise ValueError(f"unknown effort {effort!r}: choose one of {', '.join(EFFORTS)}")


# ----------------------------------------------------------------------------------------------
# sft_data

class SFTDataAssetConfig(dg.Config):
    seed: int = Field(default=0, ge=0, description="seeds the demonstration tasks (same seed → same bytes); "
                      "the held-out table uses seed + 1")
    tasks_per_family: int | None = Field(default=None, ge=1, description="default: the profile's (SIZES)")


def materialize_sft_data(context: dg.AssetExecutionContext, config: SFTDataAssetConfig,
                         profile: str) -> dg.MaterializeResult:
    from datagen.io import write_parquet
    from datagen.sft import HELD_OUT_HARNESS, SFTDataConfig, build_sft
    from datagen.tokenizer import load_tokenizer

    tag_run(context, profile)
    tokenizer_up = require_upstreams(context, ["tokenizer"], profile)["tokenizer"]
    sizes = SIZES[profile]
    cfg = SFTDataConfig(seed=config.seed, tasks_per_family=config.tasks_per_family or sizes.sft_tasks_per_family,
                        families=sizes.sft_families, max_tokens=sizes.sft_max_tokens)
    heldout_cfg = dataclasses.replace(cfg, seed=cfg.seed + 1, tasks_per_family=sizes.sft_heldout_tasks_per_family)
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

class SFTPolicyConfig(dg.Config):
    """Overrides for the SFT run; unset fields take the profile's values (SIZES)."""
    seed: int = Field(default=0, ge=0)
    steps: int | None = Field(default=None, ge=1, description="optimizer steps")
    batch_size: int | None = Field(default=None, ge=1)
    lr: float | None = Field(default=None, gt=0, description="peak learning rate")
    log_every: int = Field(default=10, ge=1, description="steps between live metric logs")
    eval_tasks_per_domain: int | None = Field(default=None, ge=1, description="held-out tasks per domain, "
                                              "each played at every effort")


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
    op = f"{profile}__sft_policy"
    sizes = SIZES[profile]
    try:
        cfg = SFTConfig(profile=profile, seed=config.seed, steps=config.steps or sizes.sft_steps,
                        batch_size=config.batch_size or sizes.sft_batch_size, lr=config.lr or sizes.sft_lr,
                        qat=True, log_every=config.log_every)
    except ValueError as e:
        raise dg.Failure(description=f"invalid config for {profile}/sft_policy (ops.{op}.config): {e}",
                         allow_retries=False) from e
    # base_model first: a missing one is named in the message, with the command that makes it.
    ups = require_upstreams(context, ["base_model", "sft_data", "tokenizer"], profile)
    plan = eval_plan(profile, config.eval_tasks_per_domain)
    demos = ups["sft_data"].path
    ray = context.resources.ray
    context.log.info(f"{profile}/sft_policy: {cfg.steps} steps of {cfg.batch_size} demonstrations from base_model, "
                     f"QAT on; then {plan.tasks_per_domain} held-out task(s) per domain at each effort")

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
        num_gpus=1.0 if ray.cluster_gpus(log=context.log.info) >= 1 else 0.0,
        params={"eval_tasks_per_domain": plan.tasks_per_domain, "eval_seed": plan.seed},
        description=f"{profile} SFT policy: base_model fine-tuned {cfg.steps} steps on expert demonstrations "
                    "at three efforts, QAT (MXFP4 weights, MXFP8 activations on the routed experts) from step 1",
        headline=lambda r: {"eval/success_rate": _mean(r.evals, "success_rate"),
                            **{k: r.metrics[k] for k in ("fit/loss", "eval/loss") if k in r.metrics}},
        report=report))

    r = trained.result
    m = r.metrics
    harness = per_harness(r.evals)
    base_harness = per_harness(r.start_evals)
    loss_rows = [{"domain": d, "effort": e, "fit": m.get(f"fit/loss/{d}/{e}"), "held-out": m.get(f"eval/loss/{d}/{e}")}
                 for d in DOMAINS for e in EFFORTS]
    own: dict[str, Any] = {
        "steps": cfg.steps,
        "tokens_seen": r.tokens_seen,
        "qat": True,
        "eval/success_rate": _mean(r.evals, "success_rate"),
        "eval/mean_policy_tokens": _mean(r.evals, "mean_policy_tokens"),
        "base_model/success_rate": _mean(r.start_evals, "success_rate"),
        "base_model/mean_policy_tokens": _mean(r.start_evals, "mean_policy_tokens"),
        "success_by_domain_effort": dg.MetadataValue.md(markdown_table(success_rows(r.evals, r.start_evals,
                                                                                    "base_model"))),
        "success_by_harness": dg.MetadataValue.md(markdown_table([
            {"harness": h, "n": f["n"], "success": f["success_rate"], "unparseable": f["unparseable_rate"],
             "base_model success": base_harness.get(h, {}).get("success_rate")} for h, f in harness.items()])),
        "own_token_loss": dg.MetadataValue.md(markdown_table(loss_rows)),
        **{k: float(m[k]) for k in ("fit/loss", "eval/loss", "train/first_loss", "train/final_loss",
                                    "perf/own_tokens_per_s", "perf/eval_wall_s") if k in m},
        "loss": sparkline([h.get("train/main", float("nan")) for h in r.history], "train/main",
                          f"train/main over {len(r.history)} steps"),
        "evals": dg.MetadataValue.json({"sft_policy": r.evals, "base_model": r.start_evals}),
    }
    return trained.materialize_result(own)


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
    def sft_data(context: dg.AssetExecutionContext, config: SFTDataAssetConfig) -> dg.MaterializeResult:
        return materialize_sft_data(context, config, profile)

    @dg.asset(name="sft_policy", kinds={"pytorch", "ray"},
              deps=[key(profile, n) for n in ("base_model", "sft_data", "tokenizer")],
              code_version=POSTTRAIN_CODE_VERSION, required_resource_keys=RESOURCES, **common,
              description="The SFT cold start: base_model fine-tuned on sft_data with QAT on from the first "
                          "step; held-out task success per (domain, effort) and per harness beside base_model's.")
    def sft_policy(context: dg.AssetExecutionContext, config: SFTPolicyConfig) -> dg.MaterializeResult:
        return materialize_sft_policy(context, config, profile)

    return [sft_data, sft_policy]
