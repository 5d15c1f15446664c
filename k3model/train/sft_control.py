"""The equal-token SFT control arm of an RL specialist (issue 40 item 4; DESIGN.md §5 claim 3).

The question the arm answers: does RL beat simply training sft_policy further on more verified
demonstrations of the same task families, given the same number of trained tokens? So the control
is sft_policy fine-tuned by the project's SFT trainer (`k3model.train.sft.train`: the same loss on
the model's own tokens, QAT on, AdamW with warmup + cosine) on `datagen.sft` demonstrations
(scripted-expert episodes whose verifier reward is 1) of the specialist's families at its effort,
for a token budget equal to the RL run's:

    budget = Σ_steps (policy tokens of the kept groups)     RL: the generated tokens its loss saw once
    steps  = min { S : Σ_{s<S} own(batch s) ≥ budget }      own(b): labelled tokens of SFT batch b

so the control trains on at least `budget` labelled tokens and less than one batch more. The
batches are a pure function of (seed, step) (`Demonstrations.rows`), so the step count is computed
before training by summing the labelled tokens of the batches the run will draw.

Disjointness: demonstrations use the SFT seed range (`datagen.sft.SFT_TASK_SEED_BASE` + cfg.seed ·
`SEEDS_PER_CONFIG`, ≥ 1,000,000; the held-out tasks use `recipes.EVAL_SEED_BASE` = 500,000 …), and
every row whose task has the instruction of an excluded task (the held-out ones) of the same
family is dropped: a family with few distinct prompts (echo_word: 366) repeats instructions across
seeds, and other seeds alone would demonstrate the test.

No Dagster, Ray or MLflow here. Legend: B rows per batch, S steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

import envs
from datagen.io import table_metadata, with_metadata
from datagen.sft import SFTDataConfig, build_sft
from k3model.train.sft import Demonstrations, SFTConfig, SFTResult, train


def control_demos(tokenizer, families: Sequence[str], effort: str, tasks_per_family: int, *,
                  exclude: Sequence = (), seed: int = 1) -> pa.Table:
    """Verified demonstrations of `families` at `effort` (`datagen.sft.build_sft`, data seed `seed`:
    task seeds from 1,000,000 + seed · 100,000), minus every row whose task's instruction equals an
    `exclude` task's of the same family. The metadata records what was dropped."""
    if not families:
        raise ValueError("families is empty: pass the specialist's families (the ladder cell's `selected`)")
    table = build_sft(SFTDataConfig(seed=seed, tasks_per_family=tasks_per_family, families=tuple(families),
                                    efforts=(effort,)), tokenizer)
    banned = {(t.family, t.instruction) for t in exclude}
    keep = [i for i, (family, task_seed) in enumerate(zip(table.column("family").to_pylist(),
                                                           table.column("task_seed").to_pylist()))
            if (family, envs.generate(family, task_seed).instruction) not in banned]
    meta = table_metadata(table)
    meta["control"] = {"effort": effort, "excluded_instructions": len(banned),
                       "dropped_as_excluded": table.num_rows - len(keep)}
    if not keep:
        raise ValueError(f"every demonstration of {list(families)} repeats an excluded instruction: raise "
                         "tasks_per_family or exclude fewer tasks")
    return with_metadata(table.take(keep), meta)


def own_tokens(data: Demonstrations, rows: list[int]) -> int:
    """Labelled tokens of a batch of rows: each row's own tokens but its first (`Demonstrations.batch`
    labels position t with token t + 1)."""
    return sum(int(data.own[r][1:].sum()) for r in rows)


def steps_for_tokens(data: Demonstrations, budget: int, batch_size: int, seed: int,
                     max_steps: int = 1_000_000) -> tuple[int, int]:
    """(S, tokens): the fewest steps whose batches (`data.rows(seed, s, batch_size)`) hold ≥ `budget`
    labelled tokens, and the tokens they hold."""
    if budget < 1:
        raise ValueError(f"budget must be ≥ 1 token, got {budget}: the RL run reports its policy tokens")
    total = step = 0
    while total < budget:
        if step >= max_steps:
            raise ValueError(f"{max_steps} steps hold only {total} < {budget} labelled tokens")
        total += own_tokens(data, data.rows(seed, step, batch_size))
        step += 1
    return step, total


def train_control(cfg: SFTConfig, demos: pa.Table, budget_tokens: int, policy_checkpoint: str | Path,
                  out_dir: str | Path, log_fn: Callable[[int, dict], None] | None = None) -> SFTResult:
    """sft_policy (`policy_checkpoint`) trained further on `demos` for `budget_tokens` labelled tokens
    (`cfg.steps` is replaced by `steps_for_tokens`'s count; the rest of `cfg` is the run's). The
    result's `tokens_seen` is the labelled tokens trained on: ≥ budget, < budget + one batch."""
    vocab = int(max(max(x) for x in demos.column("input_ids").to_pylist())) + 1  # checked again by train
    data = Demonstrations(demos, vocab)
    steps, tokens = steps_for_tokens(data, budget_tokens, cfg.batch_size, cfg.seed)
    result = train(replace(cfg, steps=steps), demos, out_dir, init_checkpoint=policy_checkpoint, log_fn=log_fn)
    if result.tokens_seen != tokens:  # the trainer drew other batches than the ones counted
        raise RuntimeError(f"the control trained on {result.tokens_seen} labelled tokens, {tokens} were counted")
    result.metrics.update({"control/budget_tokens": float(budget_tokens), "control/steps": float(steps),
                           "control/rows": float(len(data))})
    return result

