"""ModelCache: rollback equals decoding from scratch (states and conv windows), fork, bad caches."""

import pytest
import torch

from k3model.cache import ModelCache
from k3model.kda_layer import KDAState

from tests.k3model.test_model import smoke_model


def states(cache):
    """Every KDA tensor (conv windows, recurrent matrix) and each MLA row's visible latents."""
    out = []
    for layer in cache.layers:
        if isinstance(layer, KDAState):
            out += [layer.conv_q, layer.conv_k, layer.conv_v, layer.recurrent]
        else:
            out += [layer.buffer_BSL[b, :n] for b, n in enumerate(cache.lengths)]
    return out


def step(model, cache, tokens):
    logits = []
    for t in tokens:
        logits.append(model(torch.tensor([[t]] * cache.batch), cache=cache).logits_BTV[:, 0])
    return torch.stack(logits, 1)


@torch.no_grad()
def test_rollback_then_decode_equals_decoding_from_scratch_bitwise():
    model = smoke_model(4)
    prompt = torch.randint(0, 512, (1, 9))
    drafted, accepted, after = [5, 6, 7, 8, 9], 2, [40, 41, 42]

    cache = ModelCache.empty(model, 1, capacity=32, max_rollback=8)
    model(prompt, cache=cache)
    step(model, cache, drafted)
    cache.rollback(9 + accepted)
    assert cache.lengths == [11]
    rolled = step(model, cache, after)

    scratch = ModelCache.empty(model, 1, capacity=32)
    model(prompt, cache=scratch)
    step(model, scratch, drafted[:accepted])
    fresh = step(model, scratch, after)
    assert torch.equal(rolled, fresh)
    for a, b in zip(states(cache), states(scratch)):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="cannot roll back"):
        cache.rollback(2)


@torch.no_grad()
def test_rollback_inside_a_multi_token_verify_keeps_every_positions_state():
    model = smoke_model(5)
    prompt = torch.randint(0, 512, (1, 7))
    draft = torch.randint(0, 512, (1, 6))
    cache = ModelCache.empty(model, 1, capacity=32, max_rollback=8)
    model(prompt, cache=cache)
    verify = model(draft, cache=cache).logits_BTV  # one forward over the whole draft
    cache.rollback(7 + 4)
    rolled = step(model, cache, [3, 4])

    scratch = ModelCache.empty(model, 1, capacity=32)
    model(prompt, cache=scratch)
    stepped = step(model, scratch, draft[0, :4].tolist())
    fresh = step(model, scratch, [3, 4])
    # The verify computes its projections for 6 tokens at once, the steps one at a time: equal up to
    # GEMM rounding, not bitwise (the bitwise claim is for decode steps, above).
    torch.testing.assert_close(verify[:, :4], stepped, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rolled, fresh, rtol=1e-5, atol=1e-5)
    for a, b in zip(states(cache), states(scratch)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_fork_gives_n_independent_copies_of_a_prefilled_prompt():
    model = smoke_model(6)
    prompt = torch.randint(0, 512, (1, 10))
    cache = model(prompt, use_cache=True).cache
    group = cache.fork(4)
    assert group.batch == 4 and group.lengths == [10] * 4
    tokens = torch.tensor([[1], [2], [3], [4]])
    forked = model(tokens, cache=group).logits_BTV
    for b in range(4):
        full = model(torch.cat([prompt, tokens[b:b + 1]], 1)).logits_BTV[:, -1]
        torch.testing.assert_close(forked[b], full, rtol=1e-4, atol=1e-4)
    # The parent is untouched by its forks' steps.
    assert cache.lengths == [10]
    torch.testing.assert_close(model(tokens[:1], cache=cache).logits_BTV[0], forked[0], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_a_cache_of_another_model_or_batch_size_is_refused():
    model, other = smoke_model(0), smoke_model(0)
    cache = model(torch.randint(0, 512, (2, 5)), use_cache=True).cache
    with pytest.raises(ValueError, match="another model"):
        other(torch.zeros(2, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="2 rows but the input has 3"):
        model(torch.zeros(3, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="no history"):
        cache.rollback(3)
    with pytest.raises(ValueError, match="fork needs"):
        cache.fork(0)


@torch.no_grad()
def test_the_static_cuda_graph_layout_decodes_as_the_dynamic_one():
    # Run eagerly on the CPU: the masked whole-buffer attention and in-place updates a captured step uses.
    model = smoke_model(7)
    a, b = torch.randint(0, 512, (1, 6)), torch.randint(0, 512, (1, 11))
    dynamic = ModelCache.cat([model(a, use_cache=True).cache, model(b, use_cache=True).cache])
    static = dynamic.to_static(capacity=24)
    tokens = [[7, 8], [9, 10], [11, 12]]
    for t in tokens:
        ids = torch.tensor(t).view(2, 1)
        want = model(ids, cache=dynamic).logits_BTV
        got = model(ids, cache=static).logits_BTV
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert static.lengths_B.tolist() == dynamic.lengths == [9, 14]
    with pytest.raises(ValueError, match="at most 1 token"):
        model(torch.zeros(2, 2, dtype=torch.long), cache=static)
