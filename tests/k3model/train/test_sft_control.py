"""The equal-token SFT control: demonstrations of the cell's families minus the held-out
instructions, a step count that reaches the RL token budget within one batch, and a run from the
policy checkpoint that trains on exactly the counted tokens."""

from __future__ import annotations

import pytest
import torch

import envs
from datagen.io import table_metadata
from datagen.sft import SFT_TASK_SEED_BASE, SEEDS_PER_CONFIG
from k3model.checkpoint import load_checkpoint
from k3model.model import IGNORE_INDEX
from k3model.train.sft import Demonstrations, SFTConfig, train
from k3model.train.sft_control import control_demos, own_tokens, steps_for_tokens, train_control

SMOKE = dict(profile="smoke", batch_size=2, lr=3e-3, log_every=1)


def test_control_demos_drop_every_row_with_an_excluded_instruction(smoke_tok):
    # Data seed 1: task i has seed 1,100,000 + i. Exclude a held-out-range task with the instruction
    # of demonstration 0 (echo_word repeats its 366 instructions across seeds).
    first = envs.generate("echo_word", SFT_TASK_SEED_BASE + SEEDS_PER_CONFIG)
    twin = next(t for s in range(500_000, 520_000) if (t := envs.generate("echo_word", s)).instruction
                == first.instruction)
    table = control_demos(smoke_tok, ["echo_word"], "low", 6, exclude=[twin], seed=1)
    instructions = [envs.generate(f, s).instruction for f, s in zip(table.column("family").to_pylist(),
                                                                     table.column("task_seed").to_pylist())]
    assert first.instruction not in instructions
    assert set(table.column("effort").to_pylist()) == {"low"}
    meta = table_metadata(table)["control"]
    assert meta["dropped_as_excluded"] >= 1 and table.num_rows == 6 - meta["dropped_as_excluded"]
    assert min(table.column("task_seed").to_pylist()) >= SFT_TASK_SEED_BASE + SEEDS_PER_CONFIG
    with pytest.raises(ValueError, match="families is empty"):
        control_demos(smoke_tok, [], "low", 2)


def test_the_control_trains_from_the_policy_on_the_budget_within_one_batch(smoke_tok, demos, tmp_path):
    # A stand-in sft_policy: 2 SFT steps from a fresh smoke model.
    policy = train(SFTConfig(steps=2, **SMOKE), demos, tmp_path / "policy").checkpoint_dir
    table = control_demos(smoke_tok, ["echo_word"], "low", 6, seed=1)
    data = Demonstrations(table, vocab_size=512)
    per_batch = [own_tokens(data, data.rows(0, s, 2)) for s in range(4)]
    _, labels_BT = data.batch(data.rows(0, 0, 2))
    assert int((labels_BT != IGNORE_INDEX).sum()) == per_batch[0]  # the trainer's count
    budget = per_batch[0] + per_batch[1] + 1  # needs a third batch
    assert steps_for_tokens(data, budget, 2, 0) == (3, sum(per_batch[:3]))
    result = train_control(SFTConfig(**SMOKE), table, budget, policy, tmp_path / "control")
    assert len(result.history) == 3 and result.metrics["control/steps"] == 3
    assert budget <= result.tokens_seen == sum(per_batch[:3]) < budget + max(per_batch)
    start, _ = load_checkpoint(policy)
    end, manifest = load_checkpoint(result.checkpoint_dir)
    assert any(not torch.equal(start[k], end[k]) for k in start)  # trained from the policy's weights
    assert manifest["data_versions"]["base_model"]  # the policy checkpoint is recorded as the start
    with pytest.raises(ValueError, match="budget must be"):
        steps_for_tokens(data, 0, 2, 0)
