"""The engine's CUDA path: the decode loop over a captured step (engine.GraphStep) gives the eager
loop's tokens, at every budget, and fp32 models (whose grouped expert GEMM cannot be captured)
decode eagerly. Runs on a machine with a GPU only."""

import warnings

import pytest
import torch

from k3model.config import get_profile
from k3model.engine import SamplingConfig, decode, generate, prefill
from k3model.model import K3Model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _model(dtype):
    torch.manual_seed(0)
    return K3Model(get_profile("smoke").model).cuda().to(dtype).eval()


def _prompts(model):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, model.cfg.vocab_size, (n,), generator=g).tolist() for n in (5, 12, 7)]


@pytest.mark.parametrize("new", [1, 2, 3, 9])
def test_the_captured_decode_gives_the_eager_tokens_at_every_budget(new):
    # Budgets below the warm-up's three steps once overran the static cache (a device-side assert).
    model = _model(torch.bfloat16)
    prompts = _prompts(model)
    cfg = SamplingConfig(max_new_tokens=new)
    graphed = generate(model, prompts, cfg)
    cache, logits_BV = prefill(model, prompts, capacity=max(map(len, prompts)) + new)
    # keep_caches takes the eager loop (it pads to MIN_ROWS rows: GEMM rounding may differ in bf16).
    eager, _ = decode(model, cache, logits_BV, [cfg] * len(prompts), [new] * len(prompts), keep_caches=True)
    for g, e in zip(graphed, eager):
        assert g.token_ids == e.token_ids and len(g.token_ids) == new
        torch.testing.assert_close(torch.tensor(g.model_logprobs), torch.tensor(e.model_logprobs), atol=3e-2, rtol=0)


def test_an_fp32_model_decodes_on_cuda():
    model = _model(torch.float32)
    out = generate(model, _prompts(model), SamplingConfig(max_new_tokens=4))
    assert [len(c.token_ids) for c in out] == [4, 4, 4]


def test_the_routed_experts_sum_is_deterministic_on_cuda():
    # index_add's atomics add a token's K expert outputs in no fixed order on CUDA: inference sums
    # them in slot order (moe.sum_per_token).
    from k3model.moe import sum_per_token

    g = torch.Generator(device="cuda").manual_seed(0)
    M, K, L = 64, 8, 256
    ids_R = torch.randint(0, 16, (M * K,), device="cuda", generator=g)
    order_R = torch.argsort(ids_R, stable=True)
    rows_RL = torch.randn(M * K, L, device="cuda", generator=g)
    with torch.no_grad():  # inference: training keeps index_add
        runs = [sum_per_token(rows_RL, order_R // K, M, order_R) for _ in range(5)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    reference = torch.zeros(M, L, device="cuda").index_add(0, order_R // K, rows_RL)
    torch.testing.assert_close(runs[0], reference, atol=1e-5, rtol=1e-5)


def test_the_captured_step_of_a_compiled_model_equals_its_eager_step_bitwise():
    from k3model.compiled import compile_regions
    from k3model.engine import GraphStep

    model = compile_regions(_model(torch.bfloat16))
    prompts = [p[:5] for p in _prompts(model)]
    cache, logits_BV = prefill(model, prompts, capacity=16)
    eager_cache, graph = cache.to_static(16), GraphStep(model, cache.to_static(16))
    tokens_B = logits_BV.argmax(-1)
    with torch.no_grad():
        for _ in range(8):
            eager_BV = model(tokens_B.unsqueeze(1), cache=eager_cache).logits_BTV[:, 0]
            assert torch.equal(eager_BV, graph(tokens_B))
            tokens_B = eager_BV.argmax(-1)


@pytest.mark.parametrize("compiled", [False, True])
def test_captured_speculative_rounds_equal_the_eager_rounds_and_the_plain_greedy_output(compiled):
    # speculative_generate on CUDA in bf16 replays one captured GreedyRound a round (reused across
    # calls); the same rounds run eagerly over the same static caches must give the same tokens and
    # counts, and with eager modules both the target's plain greedy output. Compiled regions give
    # no such parity (Inductor's K + 1-token kernels round otherwise; docs/log/deploy.md): checked
    # there is only the capture.
    from k3model.compiled import compile_regions
    from k3model.draft import draft_from_mtp
    from k3model.speculative import SpeculativeStats, _decode_static, speculative_generate
    from tests.k3model.test_speculative import aligned_draft, predictable_model

    predictable = predictable_model(1).cuda().to(torch.bfloat16).eval()
    random_target = _model(torch.bfloat16)
    cases = [(predictable, aligned_draft(predictable)), (random_target, draft_from_mtp(random_target))]
    g = torch.Generator().manual_seed(2)
    cfg = SamplingConfig(max_new_tokens=12)
    accepted = 0
    for target, draft in cases:
        draft.eval()
        if compiled:
            compile_regions(target), compile_regions(draft)
        prompts = [torch.randint(0, target.cfg.vocab_size, (n,), generator=g).tolist() for n in (3, 9, 6)]
        for K in (1, 3, 4, 6):
            for prompt in prompts:
                plain = generate(target, [prompt], cfg)[0].token_ids
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    out, stats = speculative_generate(target, draft, prompt, cfg, K)
                assert any("compiled regions" in str(w.message) for w in caught) == compiled
                eager_stats = SpeculativeStats(K, reached_at_depth=[0] * K, accepted_at_depth=[0] * K)
                with torch.no_grad():
                    eager = _decode_static(target, draft, prompt, cfg, K, cfg.max_new_tokens, eager_stats, capture=False)
                assert out == eager and stats.as_dict() == eager_stats.as_dict(), (K, prompt)
                if not compiled:
                    assert out == plain, (K, prompt)
                accepted += stats.accepted
    assert accepted > 0


def test_rollouts_decode_through_the_captured_step_and_give_the_eager_episodes():
    # Continuous batching on CUDA (engine.SlotBatch): episodes join and leave a captured step's
    # static cache; 12 episodes through 8 slots (refill, then the batch shrinks to 4), observations of
    # ~1,000 tokens (the first join recaptures at a larger capacity), kept caches across turns.
    # The eager run (dynamic cache) rounds otherwise in bf16: tokens equal, log-probs close, as above.
    import envs
    from dataclasses import replace
    from k3model.engine import _CAPTURED
    from k3model.train.rollout import Job, TokenPolicy
    from tests.k3model.train.test_rollout import BYTES

    torch.manual_seed(0)
    model = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded")).cuda().to(torch.bfloat16).eval()
    names = ["slack_post", "gmail_label", "arith_word"]

    def jobs():
        return [Job(lambda k=k: envs.make_env(names[k % 3], seed=0, max_steps=1 + k % 3), seed=k, close=True)
                for k in range(12)]

    def play(graphed):
        policy = TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=5), max_concurrent=8, graphed=graphed)
        return policy.play(jobs())

    graphed, eager = play(None), play(False)
    captured = [key for key in _CAPTURED[model] if key[0] == "slots"]
    assert {key[1] for key in captured} == {8, 4} and all(key[2] >= 1024 for key in captured)
    assert [len(ep.turns) for ep in graphed] == [1 + k % 3 for k in range(12)]
    for g, e in zip(graphed, eager):
        assert g.token_ids == e.token_ids and g.generated == e.generated
        torch.testing.assert_close(torch.tensor(g.model_logprobs), torch.tensor(e.model_logprobs), atol=3e-2, rtol=0)


def test_an_fp32_policy_rolls_out_through_the_captured_step_and_sees_an_optimizer_step():
    # The trainers keep fp32 weights; TokenPolicy.play decodes them under bf16 autocast with its cast
    # cache off (train.common.autocast_for(captured=True)), so the step is captured, and a graph reused
    # after an in-place update (an optimizer step) casts the live weights: its episodes equal a fresh
    # eager run's on the updated model, tokens exactly.
    import envs
    from dataclasses import replace
    from k3model.engine import _CAPTURED
    from k3model.train.rollout import Job, TokenPolicy
    from tests.k3model.train.test_rollout import BYTES

    torch.manual_seed(0)
    model = K3Model(replace(get_profile("smoke").model, name="smoke-fp32-policy")).cuda().eval()
    assert next(model.parameters()).dtype == torch.float32

    def play(graphed):
        jobs = [Job(lambda k=k: envs.make_env("arith_word", seed=k, max_steps=2), seed=k, close=True) for k in range(8)]
        return TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=6), max_concurrent=8, graphed=graphed).play(jobs)

    before = play(None)
    assert any(key[0] == "slots" for key in _CAPTURED[model])
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    after, eager = play(None), play(False)
    assert [e.token_ids for e in after] != [e.token_ids for e in before]
    for g, e in zip(after, eager):
        assert g.token_ids == e.token_ids
        torch.testing.assert_close(torch.tensor(g.model_logprobs), torch.tensor(e.model_logprobs), atol=3e-2, rtol=0)


def test_a_qat_policy_rolls_out_twice_through_the_captured_step():
    # A QAT policy (sft_policy onward) decodes with frozen expert stacks (k3model.train.qat), which a
    # captured step reads by address; they are freed when a play ends. A later play must not replay a
    # step that reads them (else NaN logits: docs/log/gpu.md). NaN tensors of their sizes made between
    # the plays take the freed blocks, as the next tensors would.
    import envs
    from dataclasses import replace
    from k3model.moe import LatentMoE
    from k3model.train.qat import prepare_qat
    from k3model.train.rollout import Job, TokenPolicy
    from tests.k3model.train.test_rollout import BYTES

    torch.manual_seed(0)
    model = prepare_qat(K3Model(replace(get_profile("smoke").model, name="smoke-qat-policy")).cuda()).eval()

    def play():
        jobs = [Job(lambda k=k: envs.make_env("arith_word", seed=k, max_steps=2), seed=k, close=True) for k in range(8)]
        return TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=6), max_concurrent=8).play(jobs)

    first = play()
    taken = [torch.full_like(w, float("nan")) for m in model.modules() if isinstance(m, LatentMoE)
             for w in (m.w_gate_EHL, m.w_up_EHL, m.w_down_ELH)]
    second = play()
    del taken
    for a, b in zip(first, second):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.model_logprobs), torch.tensor(b.model_logprobs), atol=1e-5, rtol=0)
