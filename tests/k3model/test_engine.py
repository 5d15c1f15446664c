"""The generation engine: batch invariance, recorded log-probabilities against score, sampling filters, bad input."""

import pytest
import torch

from k3model.engine import SamplingConfig, generate, sample, score

from tests.k3model.test_model import smoke_model


def prompts_of(lengths, seed=0, vocab=512):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]



def test_a_batch_gives_every_row_what_it_gets_alone_greedy_bitwise(one_thread):
    model = smoke_model()
    # Equal lengths share a prefill (17 twice, 2 twice: a forward of fewer than 4 token rows).
    prompts = prompts_of([5, 17, 1, 9, 17, 30, 17, 2, 2])
    prompts[4] = list(prompts[1])  # a duplicate prompt is prefilled once and forked
    cfgs = [SamplingConfig(max_new_tokens=n, stop_ids=s) for n, s in
            [(12, ()), (7, ()), (12, ()), (3, ()), (7, ()), (10, ()), (9, ()), (5, ()), (6, ())]]
    batch = generate(model, prompts, cfgs)
    for prompt, cfg, got in zip(prompts, cfgs, batch):
        alone = generate(model, [prompt], cfg)[0]
        assert got.token_ids == alone.token_ids
        assert got.model_logprobs == alone.model_logprobs  # bitwise, not approximately
        assert got.finish_reason == alone.finish_reason == "length"
        assert len(got.token_ids) == cfg.max_new_tokens and got.logprobs == [0.0] * cfg.max_new_tokens
    # A stop id ends its row only, and is kept as the last sampled id.
    stop = batch[0].token_ids[4]
    stopped = generate(model, prompts[:2], [SamplingConfig(12, stop_ids=(stop,)), cfgs[1]])
    first = batch[0].token_ids.index(stop)
    assert stopped[0].token_ids == batch[0].token_ids[: first + 1] and stopped[0].finish_reason == "stop"
    assert stopped[1].token_ids == batch[1].token_ids


def test_cpu_matmuls_give_a_row_the_same_bits_at_any_row_count(one_thread):
    # What the batch invariance above stands on: MKL's strict mode, set by k3model/__init__.py (on an
    # AVX-512 + AMX Xeon without it a 128-wide row differs at M = 4 and at M ≥ 6).
    generator = torch.Generator().manual_seed(1)
    for width_in, width_out in [(64, 64), (128, 64), (128, 128), (256, 256), (96, 256), (64, 2048)]:
        w = torch.randn(width_out, width_in, generator=generator)
        x = torch.randn(80, width_in, generator=generator)
        first = torch.nn.functional.linear(x[:4], w)[0]
        assert [m for m in range(4, 81) if not torch.equal(torch.nn.functional.linear(x[:m], w)[0], first)] == []


def test_greedy_equals_argmax_of_the_full_forward():
    model = smoke_model(3)
    prompt = prompts_of([12], seed=1)[0]
    got = generate(model, [prompt], SamplingConfig(max_new_tokens=6))[0].token_ids
    seq = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, model(seq).logits_BTV[:, -1].argmax(-1, keepdim=True)], 1)
    assert got == seq[0, 12:].tolist()


def test_recorded_model_logprobs_equal_score_for_sampled_sequences():
    model = smoke_model(1)
    prompts = prompts_of([3, 20, 11, 40], seed=2)
    cfg = SamplingConfig(max_new_tokens=16, temperature=1.3, top_k=50, top_p=0.9)
    outs = generate(model, prompts, cfg, generator=torch.Generator().manual_seed(0))
    seqs = [p + o.token_ids for p, o in zip(prompts, outs)]
    scored = score(model, seqs, [len(p) for p in prompts], max_batch_tokens=64)
    for o, s in zip(outs, scored):
        assert len(s) == len(o.token_ids) == 16
        torch.testing.assert_close(torch.tensor(o.model_logprobs), torch.tensor(s), rtol=0, atol=1e-5)
        # Tempered and filtered: the sampling distribution puts more mass on each kept id.
        assert all(lp <= 0 for lp in o.logprobs) and o.logprobs != o.model_logprobs
    # The same generator seed gives the same samples.
    again = generate(model, prompts, cfg, generator=torch.Generator().manual_seed(0))
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]


def test_sampling_filters_keep_the_top_k_and_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 2))
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(200):
        tok, logp, model_logp = sample(logits, [SamplingConfig(1, temperature=1.0, top_k=2),
                                                SamplingConfig(1, temperature=1.0, top_p=0.8)], g)
        seen.add(tuple(tok.tolist()))
        # Row 0 samples from {0: 0.5/0.8, 1: 0.3/0.8}; row 1's nucleus is also {0, 1} (0.5 + 0.3 ≥ 0.8).
        expected = torch.log(torch.tensor([0.5, 0.3]) / 0.8)[tok]
        torch.testing.assert_close(logp, expected)
        torch.testing.assert_close(model_logp, logits[0, tok])
    assert {t for pair in seen for t in pair} == {0, 1}


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=4, top_p=0.0), "top_p"),
    (dict(max_new_tokens=4, top_p=1.5), "top_p"),
    (dict(max_new_tokens=4, temperature=-1.0), "temperature"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=4, top_k=0), "top_k"),
])
def test_bad_sampling_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_bad_prompts_raise():
    model = smoke_model()
    cfg = SamplingConfig(max_new_tokens=2)
    with pytest.raises(ValueError, match="empty"):
        generate(model, [[1, 2], []], cfg)
    with pytest.raises(ValueError, match="context"):
        generate(model, [[1] * 513], cfg)  # the smoke profile's longest stage is 512 tokens
    with pytest.raises(ValueError, match="outside"):
        generate(model, [[1, 512]], cfg)
    with pytest.raises(ValueError, match="one SamplingConfig"):
        generate(model, [[1], [2]], [cfg])
    with pytest.raises(ValueError, match="prompt_lens"):
        score(model, [[1, 2, 3]], [0])



def test_rows_that_join_and_leave_a_slot_batch_get_what_they_get_alone(one_thread):
    # engine.SlotBatch (continuous batching): prompt i joins at step 2·i, prompt 1 leaves after 3
    # tokens (copied out of the batch) and rejoins 2 steps later (copied in), the batch shrinks
    # to 4 rows at the end; every row's greedy tokens and log-probabilities equal the row decoded
    # alone, bitwise.
    from k3model.engine import SlotBatch, prefill
    model = smoke_model()
    prompts = prompts_of([5, 17, 9, 30, 12, 8])
    new = 6
    alone = [generate(model, [p], SamplingConfig(max_new_tokens=new))[0] for p in prompts]
    batch = SlotBatch(model, 6)
    tokens = [[] for _ in prompts]
    logps = [[] for _ in prompts]
    rows: dict[int, int] = {}
    out_of_batch = None  # (cache, logits, step) of prompt 1 while it is out
    logits_BV = torch.zeros(6, model.cfg.vocab_size)
    with torch.no_grad():
        for step in range(60):
            for i, p in enumerate(prompts):
                if step == 2 * i:
                    cache, first_BV = prefill(model, [p], new)
                    rows[i] = batch.join(cache, len(p) + new)
                    logits_BV[rows[i]] = first_BV[0]
            if out_of_batch is not None and step == out_of_batch[2] + 2:
                rows[1] = batch.join(out_of_batch[0], out_of_batch[0].lengths[0] + new)
                logits_BV[rows[1]] = out_of_batch[1]
                out_of_batch = None
            if step > 2 * len(prompts) and out_of_batch is None and len(rows) <= 2:
                order = batch.shrink(len(rows))
                if order is not None:
                    logits_BV = logits_BV[torch.tensor(order)]
                    rows = {i: order.index(b) for i, b in rows.items()}
            if not rows and out_of_batch is None and step > 2 * len(prompts):
                break
            tokens_B = logits_BV.argmax(-1)
            logp_BV = logits_BV.float().log_softmax(-1)
            for i, b in list(rows.items()):
                tokens[i].append(int(tokens_B[b]))
                logps[i].append(float(logp_BV[b, tokens_B[b]]))
                if len(tokens[i]) == new:
                    batch.leave(b)
                    del rows[i]
            if rows:
                logits_BV = batch.step(tokens_B).clone()
            if 1 in rows and len(tokens[1]) == 3:  # out, with its third token fed
                out_of_batch = (batch.leave(rows[1]), logits_BV[rows.pop(1)].clone(), step)
    assert batch.rows == 4
    assert tokens == [a.token_ids for a in alone]
    assert logps == [a.model_logprobs for a in alone]  # bitwise
