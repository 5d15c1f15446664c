"""The Ray tasks of the post-training assets (assets/posttrain.py): no Dagster import, so a Ray
worker loads only the library. Each trainer task is `task(*args, work_dir, live) -> PolicyResult`
for `assets.training`.

- `train_sft_task`: SFT from the base model, then the held-out evaluation of the policy and of the
  base model on the same tasks.
- `measure_ladder_task`: the task ladder (`k3model.train.ladder.measure_ladder`) of the SFT policy.
- `train_specialist_task`: one RL specialist (`k3model.train.grpo.train`), then the specialist and
  the SFT policy scored the same way on the same held-out tasks of its cell, and on the hard split.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from assets.ray_task import LiveLog, load_on_task_device, where_it_runs

if TYPE_CHECKING:  # the worker imports the library inside the task; the driver's CLI needs no torch
    from k3model.train.recipes import EvalPlan, SpecialistEval


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
    from k3model.train.ladder import evaluate_policy
    from k3model.train.sft import train
    result = train(cfg, demos_path, work_dir, init_checkpoint=base_checkpoint, eval_demos=heldout_path, log_fn=live)
    tokenizer = load_tokenizer(tokenizer_path)
    t0 = time.perf_counter()
    evals = evaluate_policy(load_on_task_device(result.checkpoint_dir), tokenizer, plan)
    start_evals = evaluate_policy(load_on_task_device(base_checkpoint), tokenizer, plan)
    headline = {f"eval/success/{cell}": f["success_rate"] for cell, f in evals.items()}
    headline["perf/eval_wall_s"] = time.perf_counter() - t0
    live(cfg.steps, headline)
    return PolicyResult(Path(result.checkpoint_dir), result.history, {**result.metrics, **headline}, evals,
                        start_evals, result.tokens_seen, result.resumed_from_step)


# ----------------------------------------------------------------------------------------------
# RL: the task ladder and one specialist

def measure_ladder_task(policy_checkpoint: str, tokenizer_path: str, cfg, specs: dict | None) -> dict:
    """`k3model.train.ladder.measure_ladder` of the SFT policy: the report as JSON (`to_json`), its
    flat figures, its Markdown tables (the ladder, the random and expert baselines) and where it ran."""
    from datagen.tokenizer import load_tokenizer
    from k3model.train.ladder import measure_ladder
    model = load_on_task_device(policy_checkpoint)
    report = measure_ladder(model, load_tokenizer(tokenizer_path), cfg, specs=specs)
    return {"json": report.to_json(), "metadata": report.as_metadata(), "table": report.table(),
            "baseline_table": report.baseline_table(), "where": where_it_runs()}


def train_specialist_task(cfg, policy_checkpoint: str, tokenizer_path: str, domain: str, effort: str,
                          rl_tasks: list[tuple[str, int]], eval_tasks: list[tuple[str, int]], scoring: SpecialistEval,
                          work_dir: str, live: LiveLog) -> PolicyResult:
    """One RL specialist (`k3model.train.grpo.train` from the SFT policy on its ladder tasks), then
    the specialist and the SFT policy played the same way (`scoring`, the same generator seed) on
    the same held-out tasks of its domain at its effort, and the specialist on the domain's hard
    split. Tasks travel as (family, seed) pairs and are generated here."""
    import envs
    from datagen.tokenizer import load_tokenizer
    from k3model.train.evaluate import evaluate
    from k3model.train.grpo import train
    from k3model.train.ladder import hard_tasks
    from k3model.train.stats import paired_counts
    tokenizer = load_tokenizer(tokenizer_path)
    # Resumes from `work_dir/last` when a killed run left one there (assets.training keys the work
    # dir by the inputs); the metrics' `flops/*` count the whole run's rollouts and updates either way.
    result = train(cfg, policy_checkpoint, tokenizer, work_dir, domain=domain, effort=effort,
                   tasks=[envs.generate(f, s) for f, s in rl_tasks], log_fn=live)
    held = [envs.generate(f, s) for f, s in eval_tasks]
    hard = hard_tasks(domain, scoring.hard_tasks)
    cell = f"{domain}/{effort}"
    t0 = time.perf_counter()

    def score(model, tasks):
        return evaluate(model, tokenizer, tasks, effort, samples=scoring.samples, temperature=scoring.temperature,
                        seed=scoring.seed, specs=cfg.efforts, max_episodes_per_batch=cfg.max_episodes_per_batch)

    specialist, sft = load_on_task_device(result.checkpoint_dir), load_on_task_device(policy_checkpoint)
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
