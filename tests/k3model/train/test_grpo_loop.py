"""The GRPO loop on a smoke model: real envs episodes, refill, the update, checkpoints and resume."""

from dataclasses import asdict, replace

import pytest
import torch

import envs
from datagen.sft import SFTDataConfig, build_sft, turn_tokens
from k3model.checkpoint import load_checkpoint, load_model
from k3model.config import get_profile
from k3model.model import K3Model
from k3model.train.common import save_state
from k3model.train.effort import EFFORT_SPECS, EffortSpec
from k3model.train.grpo import GRPOConfig, _update, train
from k3model.train.qat import QAT_SCHEME, prepare_qat, qat_enabled
from k3model.train.sft import SFTConfig, train as sft_train
from k3model.train.rollout import Episode, PolicyTurn

# Budgets of a few tokens per turn keep a random model's episodes short; the smoke context (512) is
# shorter than a smoke-tokenized prompt, so the policy is the smoke shape under another name.
SPECS = {e: EffortSpec(budget_tokens=64, length_coef=s.length_coef, turn_tokens=8) for e, s in EFFORT_SPECS.items()}
CFG = GRPOConfig(group_size=4, groups_per_step=2, max_draw_factor=3, steps=2, efforts=SPECS, lr=1e-3, ckpt_every=1)


@pytest.fixture(scope="module")
def policy(tmp_path_factory, smoke_tok):
    torch.manual_seed(0)
    model = prepare_qat(K3Model(replace(get_profile("smoke").model, name="smoke-unbounded")))
    # A policy whose output head only knows <|end|>: every other id has logit 0 and <|end|> a logit
    # that depends on the context, so turns end early at random and a group's episodes (8 turns at
    # most: the env's step budget) differ in length — the length term's signal at low effort.
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[turn_tokens(smoke_tok, "low").stop_id] = 0.5
    path = tmp_path_factory.mktemp("policy") / "sft"
    save_state(path, model, {"config": {"model": asdict(model.cfg), "qat": QAT_SCHEME}})
    return path


def test_the_loop_refills_uninformative_groups_and_resumes_exactly(policy, smoke_tok, tmp_path):
    tasks = [envs.generate("echo_word", s) for s in range(3)]
    logs = []
    result = train(CFG, policy, smoke_tok, tmp_path / "a", domain="general_tasks", effort="low",
                   harnesses=("codex", "hermes"), tasks=tasks, log_fn=lambda s, m: logs.append((s, m)),
                   eval_tasks=tasks[:2])
    h = result.history
    assert [row["step"] for row in h] == [1, 2]
    for row in h:
        # Random policy: nothing solved, so only the length term (low: c = 0.2) separates episodes.
        assert row["rl/success"] == 0.0
        assert row["rl/tokens_per_episode"] <= 64 and row["perf/rollout_tokens_per_s"] > 0
    # Random policy: nothing solved, so no group has both a success and a failure — every group is
    # uninformative (its lengths differ, but groups are judged on correctness), refill draws
    # max_draw_factor·P groups, and no update happens.
    assert all("train/loss" not in row and row["rl/frac_zero_variance"] == 1.0
               and row["rl/groups_drawn"] == CFG.max_draw_factor * CFG.groups_per_step for row in h)
    # Epoch by epoch over the 3 prompts: 6 groups a step.
    assert [row["rl/groups_drawn_total"] for row in h] == [6.0, 12.0] and h[-1]["rl/prompt_epochs"] == 4.0
    assert result.metrics["eval/n"] == 2 and logs[-1][1] is not None
    # The checkpoint keeps QAT on and names its policy and specialist.
    _, manifest = load_checkpoint(result.checkpoint_dir)
    assert manifest["config"]["qat"] == QAT_SCHEME and manifest["config"]["effort"] == "low"
    model, _ = load_model(result.checkpoint_dir)
    assert qat_enabled(model)
    before, _ = load_checkpoint(policy)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k.endswith("expert_bias_E"))
    # No informative group, so no update: the weights are sft_policy's (the update itself is tested below).
    assert all(torch.equal(before[k], after[k]) for k in before)
    # A run killed after one step and called again ends where the uninterrupted one did.
    train(CFG, policy, smoke_tok, tmp_path / "b", domain="general_tasks", effort="low",
          harnesses=("codex", "hermes"), tasks=tasks, stop_after=1)
    again = train(CFG, policy, smoke_tok, tmp_path / "b", domain="general_tasks", effort="low",
                  harnesses=("codex", "hermes"), tasks=tasks)
    assert again.resumed_from_step == 1
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]  # noqa: E731
    assert strip(again.history) == strip(h)
    # The counted FLOPs are the whole run's, the steps before the resume point included: within the
    # padding of the decode batches (counted as run), which the envs' answer times shape.
    assert result.metrics["flops/total"] > 0
    assert again.metrics["flops/total"] == pytest.approx(result.metrics["flops/total"], rel=0.01)
    wa, _ = load_checkpoint(result.checkpoint_dir)
    wb, _ = load_checkpoint(again.checkpoint_dir)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def echo_policy(tmp_path_factory, smoke_tok):
    """(checkpoint, tasks): a smoke policy fine-tuned on two echo_word demonstrations (codex, low)
    until it answers them most of the time at temperature 1 (about 15 s): groups that mix successes
    and failures, which a random policy never has."""
    demos = build_sft(SFTDataConfig(tasks_per_family=2, families=("echo_word",), harnesses=("codex",),
                                    efforts=("low",)), smoke_tok)
    root = tmp_path_factory.mktemp("echo")
    torch.manual_seed(0)
    base = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded"))
    save_state(root / "base", base, {"config": {"model": asdict(base.cfg)}})
    ckpt = sft_train(SFTConfig(profile="smoke", steps=150, batch_size=2, lr=1e-2, qat=False, log_every=50), demos,
                     root / "sft", init_checkpoint=root / "base").checkpoint_dir
    return ckpt, [envs.generate("echo_word", s) for s in demos.column("task_seed").to_pylist()]



def test_mixed_groups_are_trained_on_and_uniform_ones_dropped(echo_policy, smoke_tok, tmp_path, one_thread):
    ckpt, tasks = echo_policy
    specs = {e: EffortSpec(budget_tokens=256, length_coef=s.length_coef, turn_tokens=128) for e, s in EFFORT_SPECS.items()}
    cfg = GRPOConfig(group_size=8, groups_per_step=1, max_draw_factor=4, steps=2, efforts=specs, lr=1e-3)
    h = train(cfg, ckpt, smoke_tok, tmp_path, domain="general_tasks", effort="low", harnesses=("codex",),
              tasks=tasks).history
    # A step updates exactly when it kept a group with both a success and a failure; an all-correct
    # group (whatever its lengths) is dropped like an all-wrong one.
    for row in h:
        assert ("train/loss" in row) == (row["rl/groups_kept"] > 0)
    updated = [row for row in h if "train/loss" in row]
    assert updated and all(0 < row["rl/success"] < 1 for row in updated)
    # The second pass sees the policy the first one moved: ρ ≠ 1 (π_old fixed at the sampler).
    assert all(abs(row["rl/ratio_mean"] - 1.0) > 1e-3 for row in updated)
    before, _ = load_checkpoint(ckpt)
    after, _ = load_checkpoint(tmp_path / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # Killed after its first step (ckpt_every 0: a resume point per step of these two) and called
    # again, the run ends where the uninterrupted one did: the prompt cursor, both passes, the weights.
    train(cfg, ckpt, smoke_tok, tmp_path / "b", domain="general_tasks", effort="low", harnesses=("codex",),
          tasks=tasks, stop_after=1)
    again = train(cfg, ckpt, smoke_tok, tmp_path / "b", domain="general_tasks", effort="low", harnesses=("codex",),
                  tasks=tasks)
    assert again.resumed_from_step == 1
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]  # noqa: E731
    assert strip(again.history) == strip(h)
    resumed, _ = load_checkpoint(again.checkpoint_dir)
    assert all(torch.equal(after[k], resumed[k]) for k in after)


def test_the_update_is_the_token_sum_loss_with_tis_weights(policy):
    model, _ = load_model(policy)
    # Two episodes of one group: 3 and 1 generated tokens, rewards 1 and 0 → A = +0.5, −0.5.
    eps = []
    for reward, gen in ((1.0, [7, 8, 9]), (0.0, [7])):
        ep = Episode(reward=reward)
        ep.append([1, 2, 3, 4], generated=False)
        ep.append(gen, generated=True, logprobs=[0.0] * len(gen), model_logprobs=[0.0] * len(gen))
        ep.turns = [PolicyTurn(4, gen, [0.0] * len(gen), [0.0] * len(gen), "stop", "")]
        eps.append(ep)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    from k3model.engine import score
    lp = [score(model, [ep.token_ids], [4])[0] for ep in eps]
    out = _update(model, None, opt, [eps], lambda g: [ep.reward for ep in g], CFG, "cpu")
    # ratio 1; w = min(exp(logp − 0), 2) = p (all p < 2); loss = −Σ w·A / 4 tokens.
    expected = -(0.5 * sum(torch.tensor(lp[0]).exp()) - 0.5 * torch.tensor(lp[1]).exp().sum()) / 4
    torch.testing.assert_close(out["train/loss"], expected.float(), rtol=1e-4, atol=1e-6)
    # One micro-batch padded to 7, run in each of the 2 passes.
    assert out["rl/policy_tokens"] == 4 and out["_padded_tokens"] == CFG.updates_per_batch * 2 * 7
    assert out["rl/logp_diff_mean"] == pytest.approx(sum(lp[0] + lp[1]) / 4, abs=1e-5)
    assert float(out["train/grad_norm"]) > 0
    # lr 0: the policy never moves, so π_θ = π_old in the last pass too.
    assert float(out["rl/ratio_mean"]) == pytest.approx(1.0)
    # With a step that moves the policy, the second pass sees π_θ ≠ π_old (fixed at pass 1) and clips
    # (ε = 0.02 so that one small SGD step already leaves the trust region). The sampler's log-probs
    # are set to the model's own, so the TIS weights are 1.
    for ep, lps in zip(eps, lp):
        ep.logprobs = [0.0] * 4 + list(lps)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    tight = replace(CFG, clip_low=0.02, clip_high=0.02)
    moved = _update(model, None, opt, [eps], lambda g: [ep.reward for ep in g], tight, "cpu")
    assert float(moved["rl/tis_weight_mean"]) == pytest.approx(1.0, abs=1e-4)
    assert abs(float(moved["rl/ratio_mean"]) - 1.0) > 0.02
    assert float(moved["rl/clip_high_frac"]) + float(moved["rl/clip_low_frac"]) > 0


@pytest.mark.parametrize("kwargs, match", [({"domain": "poetry"}, "unknown domain"),
                                           ({"effort": "medium"}, "unknown effort"),
                                           ({"harnesses": ("openclaw",)}, "held out"),
                                           ({"tasks": [envs.generate("slack_ping", 0)]}, "not 'general_tasks'")])
def test_bad_input_says_what_to_change(policy, smoke_tok, tmp_path, kwargs, match):
    args = {"domain": "general_tasks", "effort": "low", **kwargs}
    with pytest.raises(ValueError, match=match):
        train(CFG, policy, smoke_tok, tmp_path, **args)
