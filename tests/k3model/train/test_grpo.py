"""The pure parts of the GRPO update on hand-computed batches."""

from __future__ import annotations

import math

import pytest
import torch

from k3model.train.effort import EFFORT_SPECS
from k3model.train.grpo import (GRPOConfig, group_advantages, has_variance, length_term, logprob_mismatch, policy_loss,
                                prompt_order, refill_groups, shaped_rewards, token_logprobs)


def test_advantages_are_rewards_minus_the_group_mean_and_optionally_over_its_std():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert torch.equal(group_advantages(r), torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]))
    # Unbiased std of (1, 0, 0, 1) is sqrt(1/3): 0.5 / 0.57735 = 0.8660.
    torch.testing.assert_close(group_advantages(r, "std")[0], torch.tensor([1, -1, -1, 1]) * 0.5 / math.sqrt(1 / 3),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="group of ≥ 2"):
        group_advantages(torch.tensor([[1.0], [0.0]]))
    # (1, 0, 0, 0): mean 0.25, so 0.75 for the success and −0.25 · 0.5 for each failure.
    assert torch.equal(group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), negative_scale=0.5),
                       torch.tensor([[0.75, -0.125, -0.125, -0.125]]))
    with pytest.raises(ValueError, match="negative_scale"):
        GRPOConfig(negative_scale=1.5)


def test_length_term_rewards_short_right_answers_and_never_short_wrong_ones():
    correct = torch.tensor([[1, 1, 0, 0]])
    lengths = torch.tensor([[10, 20, 30, 10]])
    # lo 10, hi 30: λ = 0.5 − (0, 10, 20, 0) / 20 = (0.5, 0, −0.5, 0.5); wrong ones keep min(0, λ).
    assert torch.equal(length_term(correct, lengths), torch.tensor([[0.5, 0.0, -0.5, 0.0]]))
    torch.testing.assert_close(shaped_rewards(correct, lengths, 0.2), torch.tensor([[1.1, 1.0, -0.1, 0.0]]))
    assert torch.equal(length_term(correct, torch.full((1, 4), 7)), torch.zeros(1, 4))  # all equal: no term
    # Effort: low is pushed hardest toward short answers, max not at all, and budgets grow.
    assert EFFORT_SPECS["low"].length_coef > EFFORT_SPECS["high"].length_coef > EFFORT_SPECS["max"].length_coef == 0
    assert EFFORT_SPECS["low"].budget_tokens < EFFORT_SPECS["high"].budget_tokens < EFFORT_SPECS["max"].budget_tokens


def test_zero_variance_groups_are_dropped_and_the_batch_refilled():
    pool = [[1, 1], [0, 1], [0, 0], [1, 0], [0, 1]]
    asked = []

    def draw(k):
        asked.append(k)
        out = pool[:k]
        del pool[:k]
        return out

    kept, stats = refill_groups(draw, lambda g: g, n_groups=2, max_draws=5)
    # Round 1 asks 2: (1,1) dropped, (0,1) kept; round 2 asks 1: (0,0) dropped; round 3 asks 1: (1,0) kept.
    assert kept == [[0, 1], [1, 0]] and asked == [2, 1, 1]
    assert stats == {"rl/groups_drawn": 4.0, "rl/frac_zero_variance": 0.5, "rl/groups_kept": 2.0}
    pool[:] = [[1, 1], [0, 1], [0, 0], [1, 0]]
    kept, stats = refill_groups(draw, lambda g: g, n_groups=2, max_draws=3)
    assert kept == [[0, 1]] and stats["rl/groups_drawn"] == 3.0  # the draw limit leaves the batch short


def test_an_all_fail_group_of_unequal_lengths_is_uninformative():
    # The audit's group at low effort: four failures of 40/60/90/128 tokens. λ = 0.5 − (0, 20, 50, 88)/88,
    # wrong answers keep min(0, λ) = (0, 0, −6/88, −0.5), times c = 0.2: the shaped rewards vary and
    # would give A = r − mean = (+.0284, +.0284, +.0148, −.0716) — a gradient on length alone.
    correct, lengths = torch.zeros(1, 4), torch.tensor([[40, 60, 90, 128]])
    r = shaped_rewards(correct, lengths, 0.2)
    torch.testing.assert_close(r, torch.tensor([[0.0, 0.0, -0.2 * 6 / 88, -0.1]]))
    torch.testing.assert_close(group_advantages(r), r - r.mean(), rtol=0, atol=1e-7)
    assert has_variance(r[0].tolist()) and not has_variance(correct[0].tolist())
    # refill_groups judges correctness: that group is dropped, a mixed one kept; an all-correct
    # group of unequal lengths is dropped too.
    groups = [([0, 0, 0, 0], [40, 60, 90, 128]), ([1, 1, 1, 1], [10, 20, 30, 40]), ([1, 0, 0, 0], [40, 60, 90, 128])]
    kept, stats = refill_groups(lambda k: [groups.pop(0) for _ in range(k)], lambda g: g[0], n_groups=1, max_draws=3)
    assert kept == [([1, 0, 0, 0], [40, 60, 90, 128])] and stats["rl/frac_zero_variance"] == pytest.approx(2 / 3)


def test_every_prompt_is_drawn_once_before_any_repeats():
    n = 5
    first = prompt_order(n, seed=0, start=0, count=n)
    second = prompt_order(n, seed=0, start=n, count=n)
    assert sorted(first) == sorted(second) == list(range(n))
    # Draws split over steps and refills (2 + 1 + 4 + 3 groups) follow the same order as one draw.
    parts, at = [], 0
    for k in (2, 1, 4, 3):
        parts += prompt_order(n, 0, at, k)
        at += k
    assert parts == first + second
    assert prompt_order(n, seed=1, start=0, count=n) != first or prompt_order(n, 2, 0, n) != first
    with pytest.raises(ValueError, match="n_prompts"):
        prompt_order(0, 0, 0, 1)


def test_the_clip_acts_once_the_policy_has_moved_from_pi_old():
    """Two updates of one batch through `policy_loss`, π_old fixed at the sampling policy: a single
    token of logit θ (π = σ(θ) against one other token), A = +1, SGD with lr 10 on the summed loss."""
    theta = torch.zeros((), requires_grad=True)
    opt = torch.optim.SGD([theta], lr=10.0)
    logp_old = torch.nn.functional.logsigmoid(theta).detach().reshape(1, 1)  # log ½
    adv, mask = torch.tensor([1.0]), torch.ones(1, 1)
    ratios, grads = [], []
    for _ in range(2):
        opt.zero_grad()
        loss, stats = policy_loss(torch.nn.functional.logsigmoid(theta).reshape(1, 1), logp_old, logp_old, adv, mask)
        loss.backward()
        ratios.append(float(stats["rl/ratio_mean"]))
        grads.append(float(theta.grad))
        opt.step()
    # Pass 1: ρ = 1, d(−ρ)/dθ = −(1 − σ(0)) = −½, θ → 5. Pass 2: ρ = σ(5)/½ = 1.9866 > 1.28: clipped, no gradient.
    assert ratios[0] == 1.0 and grads[0] == pytest.approx(-0.5)
    assert ratios[1] == pytest.approx(2 * torch.sigmoid(torch.tensor(5.0)).item()) and grads[1] == 0.0


def _batch():
    """Two sequences of two tokens, hand-made so every branch of the loss is taken:
    seq 0 (A = +1): token 0 ratio 1.5 (clipped at 1.28), TIS weight min(3, 2) = 2; token 1 ratio 1, w 1.
    seq 1 (A = −1): token 0 ratio 0.5 (clipped at 0.8), w 1; token 1 masked out."""
    logp_old = torch.log(torch.full((2, 2), 0.5))
    logp = torch.log(torch.tensor([[0.75, 0.5], [0.25, 0.5]])).requires_grad_()
    logp_rollout = logp_old.clone()
    logp_rollout[0, 0] = logp_old[0, 0] - math.log(3.0)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    return logp, logp_old, logp_rollout, adv, mask


def test_policy_loss_clips_high_and_low_weights_by_truncated_is_and_sums_over_tokens():
    logp, logp_old, logp_rollout, adv, mask = _batch()
    loss, stats = policy_loss(logp, logp_old, logp_rollout, adv, mask)
    # per token: −2·min(1.5, 1.28)·1 = −2.56; −1·1·1 = −1; −1·min(−0.5, −0.8) = 0.8; sum / 3 tokens.
    torch.testing.assert_close(loss, torch.tensor((-2.56 - 1.0 + 0.8) / 3))
    loss.backward()
    # Only the unclipped token moves: d/dlogp of −w·ρ·A/3 at ρ = 1 is −1/3; clipped tokens get 0.
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1 / 3], [0.0, 0.0]]))
    torch.testing.assert_close(stats["rl/clip_high_frac"], torch.tensor(1 / 3))
    torch.testing.assert_close(stats["rl/clip_low_frac"], torch.tensor(1 / 3))
    torch.testing.assert_close(stats["rl/tis_weight_mean"], torch.tensor(4 / 3))
    # A fixed denominator (Dr. GRPO style, or the global count of a micro-batched step).
    loss6, _ = policy_loss(logp, logp_old, logp_rollout, adv, mask, denominator=6)
    torch.testing.assert_close(loss6, torch.tensor((-2.56 - 1.0 + 0.8) / 6))


def test_token_sum_normalisation_weights_every_token_alike():
    # A right answer of 1 token and a wrong one of 3, ratio 1 everywhere: −(1·1 − 1·3) / 4 = 0.5,
    # where a per-sequence mean would give −(1 − 1) / 2 = 0.
    z = torch.zeros(2, 3)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    loss, _ = policy_loss(z.clone().requires_grad_(), z, z, torch.tensor([1.0, -1.0]), mask)
    torch.testing.assert_close(loss, torch.tensor(0.5))
    # Micro-batches with the global token count add up to the whole batch's loss.
    parts = [policy_loss(z[i:i + 1].clone(), z[i:i + 1], z[i:i + 1], torch.tensor([1.0, -1.0])[i:i + 1],
                         mask[i:i + 1], denominator=4)[0] for i in range(2)]
    torch.testing.assert_close(sum(parts), loss)


def test_k3_kl_term_only_when_asked():
    logp, logp_old, logp_rollout, adv, mask = _batch()
    base, _ = policy_loss(logp, logp_old, logp_rollout, adv, mask)
    ref = logp.detach() + math.log(2.0)  # exp(log 2) − log 2 − 1 = 0.30685 per token
    with_kl, _ = policy_loss(logp, logp_old, logp_rollout, adv, mask, kl_coef=0.1, logp_ref_BT=ref)
    torch.testing.assert_close(with_kl - base, torch.tensor(0.1 * (1.0 - math.log(2.0))))
    with pytest.raises(ValueError, match="logp_ref"):
        policy_loss(logp, logp_old, logp_rollout, adv, mask, kl_coef=0.1)


def test_token_logprobs_and_the_rollout_training_mismatch():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    lp = token_logprobs(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.75), math.log(0.5)]]))
    stats = logprob_mismatch(torch.tensor([[0.0, -1.0, 5.0]]), torch.tensor([[-1.0, -1.0, 0.0]]),
                             torch.tensor([[1, 1, 0]]))
    # Differences on the two policy tokens: 1 and 0 (the third is masked); exp(1) > 2 is capped.
    assert stats == {"rl/logp_diff_mean": 0.5, "rl/logp_diff_abs_mean": 0.5, "rl/logp_diff_abs_max": 1.0,
                     "rl/tis_capped_frac": 0.5}


@pytest.mark.parametrize("kwargs, match", [({"group_size": 1}, "group_size"),
                                           ({"max_draw_factor": 1}, "refill on"),
                                           ({"updates_per_batch": 1}, "clip never acts"),
                                           ({"advantage_scale": "rank"}, "advantage_scale"),
                                           ({"tis_cap": 0.5}, "tis_cap"), ({"efforts": {}}, "efforts")])
def test_bad_config_says_what_to_change(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(**kwargs)
    with pytest.raises(ValueError, match="unknown effort"):
        GRPOConfig().effort("medium")
