"""The speculative loop's shortcuts against the plain computations they replace."""

import pytest
import torch

from k3model.cache import ModelCache
from k3model.draft import draft_from_mtp
from k3model.engine import SamplingConfig, generate
from k3model.speculative import speculative_generate

from tests.k3model.test_model import smoke_model
from tests.k3model.test_speculative import aligned_draft, chi_square_p_value, exact_joint, predictable_model


@torch.no_grad()
def test_draft_logits_of_the_last_position_only_are_the_full_forwards_last_row():
    target = smoke_model(11)
    draft = draft_from_mtp(target)
    torch.manual_seed(0)
    f_1TD, ids_1T = torch.randn(1, 9, target.cfg.d_model), torch.randint(0, target.cfg.vocab_size, (1, 9))
    full_cache = ModelCache.empty(draft, 1, capacity=16)
    g_full, logits_full = draft(f_1TD, ids_1T, full_cache)
    last_cache = ModelCache.empty(draft, 1, capacity=16)
    g_last, logits_last = draft(f_1TD, ids_1T, last_cache, last_only=True)
    assert logits_last.shape == (1, 1, target.cfg.vocab_size)
    assert torch.equal(g_full, g_last)
    torch.testing.assert_close(logits_last[:, 0], logits_full[:, -1], rtol=1e-5, atol=1e-6)
    # The caches hold the same entries either way.
    assert last_cache.lengths == full_cache.lengths == [9]
    assert torch.equal(last_cache.layers[0].buffer_BSL, full_cache.layers[0].buffer_BSL)


@torch.no_grad()
def test_a_chain_that_ends_early_keeps_greedy_parity():
    target = predictable_model(1)
    draft = aligned_draft(target)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (int(torch.randint(1, 9, (), generator=g)),), generator=g).tolist()
               for _ in range(4)]
    cfg = SamplingConfig(max_new_tokens=12)
    plain = [c.token_ids for c in generate(target, prompts, cfg)]
    short_rounds = 0
    for prompt, expected in zip(prompts, plain):
        fixed, fixed_stats = speculative_generate(target, draft, prompt, cfg, 5)
        out, stats = speculative_generate(target, draft, prompt, cfg, 5, min_draft_prob=0.9)
        assert out == fixed == expected
        assert stats.drafted <= fixed_stats.drafted
        short_rounds += stats.drafted < 5 * stats.rounds - 4  # more short chains than the budget's last round
    assert short_rounds > 0  # the early end ran
    with pytest.raises(ValueError, match="min_draft_prob"):
        speculative_generate(target, draft, prompts[0], cfg, 2, min_draft_prob=1.5)


@torch.no_grad()
def test_a_chain_that_ends_early_keeps_the_targets_distribution_chi_square():
    """As test_speculative.py's chi-square of speculative_generate, with chains that end after a draft
    the draft gives less than 0.6: the stopping rule reads only the draft's side."""
    n, temperature = 200, 0.5
    target = predictable_model(seed=0)
    draft = aligned_draft(target)
    prompt = [3, 7, 1, 4]
    cfg = SamplingConfig(max_new_tokens=4, temperature=temperature)
    g = torch.Generator().manual_seed(1)
    samples, drafted, full = [], 0, 0
    for _ in range(n):
        out, stats = speculative_generate(target, draft, prompt, cfg, 3, generator=g, min_draft_prob=0.6)
        samples.append(tuple(out))
        drafted, full = drafted + stats.drafted, full + 3 * stats.rounds
    assert 0 < drafted < full  # chains ended early, and drafts ran
    joint = exact_joint(target, prompt, 4, temperature)
    cells = list(joint)
    observed = [sum(s == c for s in samples) for c in cells[:-1]]
    observed.append(n - sum(observed))
    assert chi_square_p_value(observed, [joint[c] for c in cells], n) > 1e-3
