"""Speculative decoding: the acceptance rule by hand, exactness by enumeration and by chi-square,
greedy parity with the engine's plain decoding at every draft length, the MTP-initialised draft."""

import itertools
import math
from dataclasses import replace

import pytest
import torch

from k3model.attn_res import AttnRes
from k3model.cache import ModelCache
from k3model.config import get_profile
from k3model.draft import draft_from_mtp
from k3model.engine import SamplingConfig, generate, sample
from k3model.model import K3Model
from k3model.speculative import (acceptance_probs, residual, sampling_probs, speculative_generate, verify_greedy,
                                 verify_sampled)

from tests.k3model.test_model import smoke_model


def predictable_model(seed=0, vocab=512, scale=3.0):
    """A smoke-sized target whose next token mostly follows its current one (a large embedding that
    the output head reads through a fixed permutation), so drafts get accepted, rejected and
    completed (bonus tokens) in one run."""
    torch.manual_seed(seed)
    model = K3Model(replace(get_profile("smoke").model, vocab_size=vocab)).eval()
    for m in model.modules():
        if isinstance(m, AttnRes):
            torch.nn.init.normal_(m.query, std=0.5)
    with torch.no_grad():
        model.embed.weight.mul_(scale / 0.02 / 8)
        model.lm_head.weight.copy_(model.embed.weight[torch.randperm(vocab).argsort()])
    return model


def aligned_draft(target):
    """The MTP draft with its merge reading only the token embedding: it proposes what the target's
    head would make of that token, which a predictable_model often agrees with."""
    draft = draft_from_mtp(target)
    D = target.cfg.d_model
    with torch.no_grad():
        draft.merge.weight.zero_()
        draft.merge.weight[:, D:] = torch.eye(D)
    return draft


def random_draft(target, seed=123):
    draft = draft_from_mtp(target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return draft


def chi_square_p_value(observed, expected_probs, n):
    """Pearson's test, cells with expected count < 5 pooled into one; returns the p-value."""
    expected = [p * n for p in expected_probs]
    cells, pool_o, pool_e = [], 0.0, 0.0
    for o, e in zip(observed, expected):
        if e >= 5:
            cells.append((o, e))
        else:
            pool_o, pool_e = pool_o + o, pool_e + e
    if pool_e > 0:
        cells.append((pool_o, pool_e))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# --- the pure rule, by hand ----------------------------------------------------------------------

def test_acceptance_probability_and_residual_by_hand():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    q = torch.tensor([[0.2, 0.6, 0.2], [0.4, 0.4, 0.2]])
    # min(1, 0.5/0.2) = 1, min(1, 0.3/0.6) = 0.5; min(1, 0.1/0.4) = 0.25, min(1, 0.3/0.2) = 1
    torch.testing.assert_close(acceptance_probs(p, q, torch.tensor([0, 0])), torch.tensor([1.0, 0.25]))
    torch.testing.assert_close(acceptance_probs(p, q, torch.tensor([1, 2])), torch.tensor([0.5, 1.0]))
    # max(0, p − q) = [0.3, 0, 0] → [1, 0, 0];  [0, 0.2, 0.1] → [0, 2/3, 1/3]
    torch.testing.assert_close(residual(p[0], q[0]), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual(p[1], q[1]), torch.tensor([0.0, 2 / 3, 1 / 3]))
    # p = q: a rejection has probability 0; the fallback is p itself.
    torch.testing.assert_close(residual(p[0], p[0]), p[0])


def test_verify_greedy_and_sampled_by_hand():
    assert verify_greedy([5, 7, 9, 2], [5, 7, 1]) == (2, 9)
    assert verify_greedy([5, 7, 9, 2], [5, 7, 9]) == (3, 2)  # all accepted: the bonus token
    assert verify_greedy([4, 7], [5]) == (0, 4)
    one_hot = torch.eye(4)
    g = torch.Generator().manual_seed(0)
    # p(d) = q(d) = 1 for both drafts: always accepted, bonus from p_3 = δ_3.
    assert verify_sampled(one_hot[[1, 2, 3]], one_hot[[1, 2]], torch.tensor([1, 2]), g) == (2, 3)
    # p_1(d_1) = 0: rejected at once; the residual max(0, δ_0 − δ_1) = δ_0.
    assert verify_sampled(one_hot[[0, 2, 3]], one_hot[[1, 2]], torch.tensor([1, 2]), g) == (0, 0)
    # Second draft rejected: max(0, δ_3 − δ_2) = δ_3.
    assert verify_sampled(one_hot[[1, 3, 0]], one_hot[[1, 2]], torch.tensor([1, 2]), g) == (1, 3)
    # No drafts (a budget tail): one token from p_1.
    assert verify_sampled(one_hot[[2]], one_hot[:0], torch.tensor([], dtype=torch.long), g) == (0, 2)


def test_p_and_q_are_the_distribution_the_engine_samples_from():
    """Temperature, top-k and top-p as engine.sample applies them: its log-probability of each drawn
    id is log sampling_probs at that id, and ids outside the kept set have probability 0."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    g = torch.Generator().manual_seed(1)
    for cfg in (SamplingConfig(4, temperature=0.7), SamplingConfig(4, temperature=1.3, top_k=5),
                SamplingConfig(4, temperature=1.0, top_p=0.6), SamplingConfig(4, temperature=0.5, top_k=8, top_p=0.9)):
        probs = sampling_probs(logits, cfg)
        torch.testing.assert_close(probs.sum(-1), torch.ones(6))
        if cfg.top_k is not None:
            assert ((probs > 0).sum(-1) <= cfg.top_k).all()
        for _ in range(5):
            tokens, logp, _ = sample(logits, [cfg] * 6, g)
            torch.testing.assert_close(probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).log(), logp)


# --- exactness by enumeration -------------------------------------------------------------------

class HistoryModel:
    """A distribution over a tiny vocabulary for every token history (its own random logits per
    history, some ids masked to probability 0), float64: p and q depend on the whole context."""

    def __init__(self, vocab, seed, zeros):
        self.vocab, self.seed, self.zeros, self.table = vocab, seed, zeros, {}

    def __call__(self, history) -> torch.Tensor:
        key = tuple(history)
        if key not in self.table:
            g = torch.Generator().manual_seed(hash((self.seed,) + key) % 2**31)
            logits = torch.randn(self.vocab, generator=g, dtype=torch.float64) * 1.5
            if self.zeros:
                logits[torch.randint(self.vocab, (1,), generator=g)] = -math.inf
            self.table[key] = logits.softmax(-1)
        return self.table[key]


def speculative_joint(p, q, prompt, horizon, draft_len):
    """The exact distribution of the first `horizon` tokens speculative decoding emits, summed over
    every draft chain and every accept/reject outcome, built from the library's acceptance rule
    (acceptance_probs, residual) and the loop's structure (first token from the target, then rounds
    of min(draft_len, remaining − 1) drafts)."""
    out = {}

    def rounds(history, emitted, weight):
        remaining = horizon - len(emitted)
        if remaining == 0:
            out[tuple(emitted)] = out.get(tuple(emitted), 0.0) + weight
            return
        k = min(draft_len, remaining - 1)
        V = p.vocab
        for drafts in itertools.product(range(V), repeat=k):
            ctx = list(history)
            q_rows, w = [], weight
            for d in drafts:
                q_rows.append(q(ctx))
                w *= float(q_rows[-1][d])
                ctx.append(d)
            if w == 0.0:
                continue
            p_rows = torch.stack([p(list(history) + list(drafts[:j])) for j in range(k + 1)])
            acc = acceptance_probs(p_rows[:k], torch.stack(q_rows), torch.tensor(drafts, dtype=torch.long)) if k else []
            reach = w
            for a in range(k + 1):
                if a < k:
                    rejected = reach * (1 - float(acc[a]))
                    for y, r in enumerate(residual(p_rows[a], q_rows[a]).tolist()):
                        if rejected * r > 0:
                            new = list(drafts[:a]) + [y]
                            rounds(list(history) + new, emitted + new, rejected * r)
                    reach *= float(acc[a])
                else:
                    for y, r in enumerate(p_rows[k].tolist()):
                        if reach * r > 0:
                            new = list(drafts) + [y]
                            rounds(list(history) + new, emitted + new, reach * r)

    for x, w in enumerate(p(prompt).tolist()):
        if w > 0:
            rounds(list(prompt) + [x], [x], w)
    return out


def target_joint(p, prompt, horizon):
    out = {}
    for seq in itertools.product(range(p.vocab), repeat=horizon):
        w = 1.0
        for t in range(horizon):
            w *= float(p(list(prompt) + list(seq[:t]))[seq[t]])
        out[seq] = w
    return out


@pytest.mark.parametrize("draft_len", [1, 2, 3])
def test_sampled_output_distribution_is_exactly_the_targets_by_enumeration(draft_len):
    p, q = HistoryModel(3, seed=1, zeros=True), HistoryModel(3, seed=2, zeros=True)
    prompt, horizon = [0, 2], 4
    spec, exact = speculative_joint(p, q, prompt, horizon, draft_len), target_joint(p, prompt, horizon)
    assert abs(sum(spec.values()) - 1) < 1e-12
    for seq, w in exact.items():
        assert abs(spec.get(seq, 0.0) - w) < 1e-12, seq
    # The draft matters to the path taken, not the result: a one-hot q of its argmax is exact too.
    one_hot = lambda h: torch.nn.functional.one_hot(q(h).argmax(), 3).double()  # noqa: E731
    one_hot.vocab = 3
    spec = speculative_joint(p, one_hot, prompt, horizon, draft_len)
    for seq, w in exact.items():
        assert abs(spec.get(seq, 0.0) - w) < 1e-12, seq


def test_verify_sampled_draws_follow_the_target_chi_square():
    """The sampling code itself (verify_sampled's draws) at a 24-token vocabulary: the joint of a
    round's first two emitted tokens against the target's, with context-dependent p and q."""
    V, n = 24, 6000
    p, q = HistoryModel(V, seed=3, zeros=True), HistoryModel(V, seed=4, zeros=True)
    g = torch.Generator().manual_seed(0)
    prompt = [1]
    counts = torch.zeros(V * V)
    for _ in range(n):
        d1 = int(torch.multinomial(q(prompt), 1, generator=g))
        d2 = int(torch.multinomial(q(prompt + [d1]), 1, generator=g))
        p_rows = torch.stack([p(prompt), p(prompt + [d1]), p(prompt + [d1, d2])])
        a, y = verify_sampled(p_rows, torch.stack([q(prompt), q(prompt + [d1])]), torch.tensor([d1, d2]), g)
        emitted = [d1, d2][:a] + [y]
        if len(emitted) == 1:  # a rejection at once: the second token comes from the target
            emitted.append(int(torch.multinomial(p(prompt + emitted), 1, generator=g)))
        counts[emitted[0] * V + emitted[1]] += 1
    exact = [float(p(prompt)[x] * p(prompt + [x])[y]) for x in range(V) for y in range(V)]
    assert chi_square_p_value(counts.tolist(), exact, n) > 1e-3
    # The test can fail: the draft's own distribution is far from the target's.
    q_joint = [float(q(prompt)[x] * q(prompt + [x])[y]) for x in range(V) for y in range(V)]
    assert chi_square_p_value(counts.tolist(), q_joint, n) < 1e-6


def exact_joint(target, prompt, horizon, temperature, keep=1e-3):
    """The target's exact probability of every `horizon`-token continuation whose prefixes all have
    probability ≥ keep, level by level through teacher-forced forwards; the rest of the mass
    (exactly 1 − the listed) goes to the key "rest"."""
    level = {(): 1.0}
    for _ in range(horizon):
        prefixes = list(level)
        logits = target(torch.tensor([prompt + list(s) for s in prefixes])).logits_BTV[:, -1]
        probs = (logits.float() / temperature).softmax(-1).double()
        level = {prefix + (x,): level[prefix] * float(row[x])
                 for prefix, row in zip(prefixes, probs) for x in range(row.shape[0])
                 if level[prefix] * float(row[x]) >= keep}
    level["rest"] = 1.0 - sum(level.values())
    return level


@torch.no_grad()
def test_speculative_sampling_follows_the_target_chi_square():
    """speculative_generate itself, sampling at temperature 0.5 over the 512-token vocabulary: four
    emitted tokens against the target's exact joint (x₁ comes from the prefill, the rest through
    drafts of length 2, their rejections and bonus tokens)."""
    n, temperature = 200, 0.5
    target = predictable_model(seed=0)
    draft = aligned_draft(target)
    prompt = [3, 7, 1, 4]
    cfg = SamplingConfig(max_new_tokens=4, temperature=temperature)
    g = torch.Generator().manual_seed(0)
    samples, accepted = [], 0
    for _ in range(n):
        out, stats = speculative_generate(target, draft, prompt, cfg, 2, generator=g)
        samples.append(tuple(out))
        accepted += stats.accepted
    assert accepted > n // 4  # the drafts' acceptance paths ran

    def p_value(t):
        joint = exact_joint(target, prompt, 4, t)
        cells = list(joint)
        observed = [sum(s == c for s in samples) for c in cells[:-1]]
        observed.append(n - sum(observed))
        return chi_square_p_value(observed, [joint[c] for c in cells], n)

    assert p_value(temperature) > 1e-3
    # The test can fail: the same target at temperature 1 is rejected.
    assert p_value(1.0) < 1e-6


# --- greedy parity ------------------------------------------------------------------------------

def greedy_cases(prompts_per_case: int, seed: int = 0):
    """(target, draft, name, prompts of 1–8 tokens) for greedy parity: the untrained MTP draft and a
    random one on a random target (drafts rejected), an aligned draft on a predictable target."""
    g = torch.Generator().manual_seed(seed)
    random_target, predictable = smoke_model(3), predictable_model(1)
    cases = [(random_target, draft_from_mtp(random_target), "mtp"),
             (random_target, random_draft(random_target), "random"),
             (predictable, aligned_draft(predictable), "aligned")]
    for target, draft, name in cases:
        prompts = [torch.randint(0, 512, (int(torch.randint(1, 9, (), generator=g)),), generator=g).tolist()
                   for _ in range(prompts_per_case)]
        yield target, draft, name, prompts


@torch.no_grad()
def test_greedy_speculative_output_is_the_targets_greedy_output_at_every_draft_length():
    cfg = SamplingConfig(max_new_tokens=10)
    for target, draft, name, prompts in greedy_cases(6):
        plain = [c.token_ids for c in generate(target, prompts, cfg)]
        for draft_len in range(1, 7):
            for prompt, expected in zip(prompts, plain):
                out, stats = speculative_generate(target, draft, prompt, cfg, draft_len)
                assert out == expected, (name, draft_len, prompt)
                # Prefill gives one token, each verify the accepted drafts and one more.
                assert len(out) == stats.target_forwards + stats.accepted
                if name == "aligned" and draft_len >= 2:
                    assert stats.acceptance_length > 1.2, stats.as_dict()


@torch.no_grad()
def test_greedy_parity_with_a_stop_id_and_a_one_token_budget():
    target = predictable_model(1)
    draft = aligned_draft(target)
    prompt = [5, 9, 2, 11, 40]
    plain = generate(target, [prompt], SamplingConfig(max_new_tokens=12))[0].token_ids
    stop = plain[5]
    cfg = SamplingConfig(max_new_tokens=12, stop_ids=(stop,))
    out, _ = speculative_generate(target, draft, prompt, cfg, 4)
    assert out == generate(target, [prompt], cfg)[0].token_ids == plain[: plain.index(stop) + 1]
    out, stats = speculative_generate(target, draft, prompt, SamplingConfig(max_new_tokens=1), 4)
    assert out == plain[:1] and stats.rounds == 0 and stats.target_forwards == 1


@torch.no_grad()
def test_greedy_speculative_output_on_the_quantized_target_is_its_own_greedy_output(tmp_path):
    # The served target: the predictable model's MXFP4 export (packed experts, the rest bf16) loaded as
    # `k3 serve` loads it; the aligned draft built on it, so drafts are accepted and rolled back through
    # the packed experts' verify forward. Its greedy output differs from the float model's.
    from k3model.quantize import export_quantized, load_quantized
    float_target = predictable_model(2)
    export_quantized(float_target, tmp_path / "q", other_dtype=torch.bfloat16)
    served, _ = load_quantized(tmp_path / "q")
    draft = aligned_draft(served).eval()
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (3, 9, 14)]
    cfg = SamplingConfig(max_new_tokens=12)
    plain = [c.token_ids for c in generate(served, prompts, cfg)]
    assert plain != [c.token_ids for c in generate(float_target, prompts, cfg)]
    accepted = rejected = 0
    for draft_len in (1, 3, 6):
        for prompt, expected in zip(prompts, plain):
            out, stats = speculative_generate(served, draft, prompt, cfg, draft_len)
            assert out == expected, (draft_len, prompt)
            accepted, rejected = accepted + stats.accepted, rejected + stats.drafted - stats.accepted
    assert accepted > 0 and rejected > 0


# --- the draft ----------------------------------------------------------------------------------

@torch.no_grad()
def test_untrained_draft_is_the_targets_mtp_prediction_and_trained_weights_load():
    target = smoke_model(6)
    draft = draft_from_mtp(target).eval()
    ids = torch.randint(0, 512, (1, 9))
    hidden = target(ids).hidden_BTD
    mtp_hidden = target.mtp[0](hidden[:, :-1], target.embed(ids[:, 1:]))
    mtp_logits = target.lm_head(target.final_norm(mtp_hidden))
    # Features: the low and middle ones enter with zero weight at initialisation.
    features = [torch.randn_like(hidden), torch.randn_like(hidden), hidden]
    _, logits = draft(draft.fuse_features(features)[:, :-1], ids[:, 1:], ModelCache.empty(draft, 1, capacity=16))
    torch.testing.assert_close(logits, mtp_logits, rtol=1e-5, atol=1e-5)

    trained = random_draft(target)
    reloaded = draft_from_mtp(target)
    reloaded.load_state_dict(trained.state_dict())
    a = trained(hidden, ids, ModelCache.empty(trained, 1, capacity=16))[1]
    b = reloaded(hidden, ids, ModelCache.empty(reloaded, 1, capacity=16))[1]
    assert torch.equal(a, b)


def test_bad_input_says_what_to_change():
    target = smoke_model(0)
    draft = draft_from_mtp(target)
    cfg = SamplingConfig(max_new_tokens=4)
    with pytest.raises(ValueError, match="draft_len must be an int ≥ 1"):
        speculative_generate(target, draft, [1, 2], cfg, 0)
    other_vocab = K3Model(replace(get_profile("smoke").model, vocab_size=256))
    with pytest.raises(ValueError, match="256-token vocabulary but the target has 512"):
        speculative_generate(target, draft_from_mtp(other_vocab), [1, 2], cfg, 2)
    other_width = K3Model(replace(get_profile("smoke").model, d_model=32))
    with pytest.raises(ValueError, match="32-wide features but the target is 64 wide"):
        speculative_generate(target, draft_from_mtp(other_width), [1, 2], cfg, 2)
    with pytest.raises(ValueError, match="no MTP module"):
        draft_from_mtp(K3Model(replace(get_profile("smoke").model, mtp_depth=0)))
    with pytest.raises(ValueError, match="one prompt"):
        speculative_generate(target, draft, [[1, 2]], cfg, 2)
