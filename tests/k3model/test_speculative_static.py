"""Greedy speculative rounds over static caches (speculative.GreedyRound, what a CUDA graph captures
on the GPU), run eagerly on the CPU: the same output as plain greedy decoding and the same counts as
the eager loop, and ModelCache.keep against the recording cache's rollback."""

import pytest
import torch

from k3model.cache import ModelCache
from k3model.draft import draft_from_mtp
from k3model.engine import SamplingConfig, generate
from k3model.speculative import GreedyRound, SpeculativeStats, _decode_static, speculative_generate

from tests.k3model.test_model import smoke_model
from tests.k3model.test_speculative import aligned_draft, greedy_cases, predictable_model


def static_rounds(target, draft, prompt, cfg, draft_len):
    stats = SpeculativeStats(draft_len, reached_at_depth=[0] * draft_len, accepted_at_depth=[0] * draft_len)
    out = _decode_static(target, draft, prompt, cfg, draft_len, cfg.max_new_tokens, stats, capture=False)
    return out, stats


@torch.no_grad()
def test_static_rounds_give_the_targets_greedy_output_and_the_eager_loops_counts():
    cfg = SamplingConfig(max_new_tokens=10)
    partly = 0
    for target, draft, name, prompts in greedy_cases(4):
        plain = [c.token_ids for c in generate(target, prompts, cfg)]
        for draft_len in range(1, 7):
            for prompt, expected in zip(prompts, plain):
                out, stats = static_rounds(target, draft, prompt, cfg, draft_len)
                assert out == expected, (name, draft_len, prompt)
                _, eager = speculative_generate(target, draft, prompt, cfg, draft_len)
                assert stats.as_dict() == eager.as_dict(), (name, draft_len)
                partly += 0 < stats.accepted < stats.drafted
    # Rounds that accepted some drafts and rejected others (rollback into the middle of a verify).
    assert partly >= 5


@torch.no_grad()
def test_static_rounds_stop_at_a_stop_id_and_a_one_token_budget():
    target = predictable_model(1)
    draft = aligned_draft(target)
    prompt = [5, 9, 2, 11, 40]
    plain = generate(target, [prompt], SamplingConfig(max_new_tokens=12))[0].token_ids
    cfg = SamplingConfig(max_new_tokens=12, stop_ids=(plain[5],))
    assert static_rounds(target, draft, prompt, cfg, 4)[0] == plain[:6]
    assert static_rounds(target, draft, prompt, SamplingConfig(max_new_tokens=1), 4)[0] == plain[:1]


@torch.no_grad()
@pytest.mark.parametrize("kept", [1, 2, 4])
def test_keep_on_a_static_cache_is_the_recording_caches_rollback(kept):
    model = smoke_model(2).eval()
    prompt, fed = torch.randint(0, 512, (1, 7)), torch.randint(0, 512, (1, 4))
    recording = ModelCache.empty(model, 1, capacity=16, max_rollback=4)
    model(prompt, cache=recording)
    static = recording.to_static(16, max_tokens=4)
    model(fed, cache=recording)
    model(fed, cache=static)
    recording.rollback(7 + kept)
    static.keep(torch.tensor([kept]), 4)
    assert static.lengths_B.tolist() == [7 + kept]
    static.lengths = [7 + kept]
    for a, b in zip(recording.tensors(), static.tensors()):
        if a.dim() == 3 and b.shape[1] == 16:  # an MLA buffer: only the kept entries count
            a, b = a[:, : 7 + kept], b[:, : 7 + kept]
        assert torch.equal(a, b)
    # The next token continues from the same state (to rounding: a static cache's MLA attends to
    # its whole buffer under a mask, a dynamic one to its entries alone).
    nxt = torch.randint(0, 512, (1, 1))
    torch.testing.assert_close(model(nxt, cache=recording).logits_BTV, model(nxt, cache=static).logits_BTV,
                               rtol=0, atol=1e-5)


def test_bad_static_input_says_what_to_change():
    model = smoke_model(2).eval()
    cache = ModelCache.empty(model, 1, capacity=8).to_static(8)
    with pytest.raises(ValueError, match="at most 1 token"):
        with torch.no_grad():
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="max_tokens"):
        cache.keep(torch.tensor([1]), 3)
    with pytest.raises(ValueError, match="K \\+ 1"):
        GreedyRound(model, draft_from_mtp(model), cache, cache, {}, 4, capture=False)
