"""Draft training (k3model/train/draft.py): the unrolled training-time test equals the cached chain
speculative decoding runs, τ_sim by hand, a smoke training run whose draft reloads and stays
lossless, and the draft checkpoint's bad-input errors."""

import math
from dataclasses import replace

import pytest
import torch

from k3model.cache import ModelCache
from k3model.config import get_profile
from k3model.draft import draft_from_mtp, load_draft, unrolled_mask
from k3model.engine import SamplingConfig, generate
from k3model.model import K3Model
from k3model.speculative import speculative_generate
from k3model.train.draft import (DraftTrainConfig, prompts_from_demonstrations, simulated_acceptance, train,
                                 valid_positions)

from tests.k3model.test_model import smoke_model


def perturbed_draft(target, seed=5, scale=0.05):
    """The MTP draft with every weight moved a little and the low/middle features switched on, so
    the fusion and every pass are exercised."""
    draft = draft_from_mtp(target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return draft.eval()


def test_unrolled_mask_by_hand():
    # T = 4, pass 2: pass-0 keys j ≤ i − 2; pass-1 key at i − 1; pass-2 key at i.
    m = unrolled_mask(4, 2).int()
    assert m[:, :4].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]]
    assert m[:, 4:8].tolist() == [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    assert m[:, 8:].tolist() == torch.eye(4, dtype=torch.int).tolist()


@torch.no_grad()
@pytest.mark.parametrize("start", [0, 5])
def test_unroll_equals_the_cached_chain_speculative_decoding_runs(start):
    target = smoke_model(2)
    draft = perturbed_draft(target)
    g = torch.Generator().manual_seed(0)
    T, S, D = 13, 5, target.cfg.d_model
    f_1TD = torch.randn(1, T, D, generator=g)
    ids_1T = torch.randint(0, 512, (1, T), generator=g)
    passes = [draft.head(g_BTD) for g_BTD in draft.unroll(f_1TD, ids_1T, S, start=start)]
    scale = passes[0].abs().max()
    checked = 0
    for m in range(T):
        # The chain after true positions 0 … m: read them, then feed the draft's own g with the next ids.
        cache = ModelCache.empty(draft, 1, capacity=T + S)
        g_1TD, logits = draft(f_1TD[:, : m + 1], ids_1T[:, : m + 1], cache)
        torch.testing.assert_close(logits[0, -1], passes[0][0, m], rtol=0, atol=1e-5 * scale)
        h = g_1TD[:, -1:]
        for s in range(1, S):
            if m + s >= T:
                break
            h, logits = draft(h, ids_1T[:, m + s: m + s + 1], cache)
            if m + 1 >= start:  # exact from `start` on (the docstring's condition i − s + 1 ≥ start)
                torch.testing.assert_close(logits[0, -1], passes[s][0, m + s], rtol=0, atol=1e-4 * scale)
                checked += 1
    assert checked >= 20


def test_simulated_acceptance_by_hand():
    # One row, T = 6, K = 2: chains start at m = 0 … 4 (M = T − K + 1 = 5); draft s of chain m is at m + s.
    valid = torch.tensor([[False, True, True, True, True, False]])
    valid1 = valid & (torch.arange(6) >= 1)
    match0 = torch.tensor([[True, True, False, True, True, False]])
    match1 = torch.tensor([[False, False, True, True, False, False]])
    out = simulated_acceptance({"match_0": match0, "valid_0": valid, "match_1": match1, "valid_1": valid1}, 2)
    # Chains with both drafts valid: m = 1, 2, 3 (m = 0's draft 0 and m = 4's draft 1 are not).
    # Draft 0 (at m): accepted at m = 1, 3, not 2 → acc_1 = 2/3; draft 1 (at m + 1 = 2, 4): 2 yes, 4 no → 1/2.
    assert out["chains"] == 3
    assert math.isclose(float(out["acc_1"]), 2 / 3) and math.isclose(float(out["acc_2"]), 1 / 2)
    assert math.isclose(float(out["tau_sim"]), 1 + 2 / 3 + 2 / 3 * 1 / 2)
    assert math.isclose(float(out["acc_uncond_2"]), 2 / 4)


def test_valid_positions_are_the_completion_with_a_true_prefix():
    lens = torch.tensor([[3, 7]])  # prompt of 3 tokens, 7 in all: predicted tokens x_3 … x_6 ← i = 1 … 4
    assert valid_positions(lens, 8, 0)[0].nonzero().flatten().tolist() == [1, 2, 3, 4]
    assert valid_positions(lens, 8, 2)[0].nonzero().flatten().tolist() == [2, 3, 4]


def test_prompts_from_demonstrations_cut_where_own_tokens_start():
    ids = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9]]
    masks = [[0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1]]
    assert prompts_from_demonstrations(ids, masks) == [[1, 2], [1, 2, 3, 4, 5, 6]]
    assert prompts_from_demonstrations(ids, masks, max_prompt_tokens=4) == [[1, 2]]


def test_train_a_draft_on_its_targets_generations_reload_it_and_decode_losslessly(tmp_path):
    target = smoke_model(4)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (int(n),), generator=g).tolist() for n in torch.randint(4, 12, (6,), generator=g)]
    cfg = DraftTrainConfig(steps=4, batch_size=3, ttt_steps=3, gen_tokens=8, log_every=2, eval_every=2)
    logged = []
    result = train(cfg, target, prompts[:4], tmp_path / "draft", eval_prompts=prompts[4:],
                   log_fn=lambda step, m: logged.append((step, m)))
    # τ_sim before training (the MTP module as a draft) and at steps 2 and 4, in [1, 1 + K].
    assert [e["step"] for e in result.evals] == [0, 2, 4]
    assert all(1.0 <= e["eval/tau_sim"] <= 1 + cfg.ttt_steps for e in result.evals)
    assert "draft/tau_sim_untrained" in result.metrics and "draft/tau_sim_k3" in result.metrics
    assert result.history[-1]["train/loss"] < result.history[0]["train/loss"] * 2
    draft, manifest = load_draft(result.checkpoint_dir, target)
    untrained = draft_from_mtp(target)
    assert any(not torch.equal(a, b) for a, b in zip(draft.state_dict().values(), untrained.state_dict().values()))
    assert torch.equal(draft.embed.weight, untrained.embed.weight)  # the target's embedding, frozen
    assert manifest["draft"]["config"]["vocab_size"] == 512
    # The trained draft is as lossless as any: greedy output equals plain greedy at every draft length.
    sampling = SamplingConfig(max_new_tokens=8)
    for prompt in prompts[4:]:
        expected = generate(target, [prompt], sampling)[0].token_ids
        for k in range(1, 7):
            assert speculative_generate(target, draft, prompt, sampling, k)[0] == expected


def test_a_draft_checkpoint_for_another_target_is_refused(tmp_path):
    target = smoke_model(4)
    cfg = DraftTrainConfig(steps=1, batch_size=2, ttt_steps=2, gen_tokens=4)
    result = train(cfg, target, [[3, 4, 5, 6]], tmp_path / "d", eval_prompts=[[7, 8, 9, 10]])
    other_vocab = K3Model(replace(get_profile("smoke").model, vocab_size=640))
    with pytest.raises(ValueError, match="640-token vocabulary|vocabulary"):
        load_draft(result.checkpoint_dir, other_vocab)
    other_width = K3Model(replace(get_profile("smoke").model, d_model=96))
    with pytest.raises(ValueError, match="wide"):
        load_draft(result.checkpoint_dir, other_width)
    with pytest.raises(ValueError, match="not a draft checkpoint"):
        from k3model.checkpoint import save_checkpoint
        save_checkpoint(tmp_path / "plain", {"w": torch.zeros(1)}, {})
        load_draft(tmp_path / "plain", target)


def test_draft_train_config_refuses_bad_values():
    with pytest.raises(ValueError, match="ttt_steps"):
        DraftTrainConfig(ttt_steps=0)
    with pytest.raises(ValueError, match="step_weight"):
        DraftTrainConfig(step_weight=0.0)
