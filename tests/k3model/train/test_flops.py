"""Counted FLOPs: the per-token formula by hand, and the parameter count it stands on."""

import pytest

from k3model.config import get_profile
from k3model.params import count_params
from k3model.train.flops import FlopCounter, attention_width, forward_flops, matmul_params, train_flops


def test_forward_and_train_flops_by_hand():
    # N = 10, attention width 3, L = 4: 2·10·4 + 3·4·5 = 80 + 60; training is three forwards.
    assert forward_flops(10, 3, 4) == 140.0
    assert train_flops(10, 3, 4) == 420.0
    assert forward_flops(10, 3, 0) == 0.0
    with pytest.raises(ValueError):
        forward_flops(10, 3, -1)


def test_matmul_params_leave_out_lookups_vision_and_mtp():
    cfg = get_profile("tiny").model
    counts = count_params("tiny")
    # tiny: untied embeddings, so the embedding table is a lookup; the vision tower and MTP are idle.
    assert matmul_params(cfg) == counts["active"] - counts["parts"]["embedding"] - counts["parts"]["vision"]
    # One MLA layer of 4 heads, d_qk = 32 + 16, d_v = 32.
    assert attention_width(cfg) == 1 * 4 * (32 + 16 + 32)


def test_counter_totals_by_kind():
    c = FlopCounter(n_params=10, attn_width=3)
    c.add_forward([4, 0], "teacher")
    c.add_train(4)
    assert c.as_dict() == {"teacher": 140.0, "train": 420.0, "total": 560.0}
    d = FlopCounter(10, 3)
    d.restore(c.as_dict())
    assert d.as_dict() == c.as_dict()


def test_counting_sees_every_forward_with_its_context():
    import torch
    from dataclasses import replace
    from k3model.cache import ModelCache
    from k3model.model import K3Model
    from k3model.train.flops import counting, span_attention

    cfg = replace(get_profile("smoke").model, name="smoke-unbounded")
    model = K3Model(cfg)
    N, W = matmul_params(cfg), attention_width(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 5))
    with counting() as c:
        with torch.no_grad():
            model(ids)  # 2 rows of 5 tokens, no cache: positions 1..5
            cache = ModelCache.empty(model, 1, capacity=8)
            model(ids[:1, :3], cache=cache, logits=False)  # a prefill of 3
            model(ids[:1, 3:4], cache=cache, logits=False)  # one decode step at position 4
        model.train()
        model(ids[:1])  # with gradients: forward + backward
    fwd = 2 * (2 * N * 5 + span_attention(W, 0, 5)) + (2 * N * 3 + span_attention(W, 0, 3)) \
        + (2 * N + span_attention(W, 3, 1))
    assert c.totals["forward"] == pytest.approx(fwd)
    assert c.totals["train"] == pytest.approx(3 * (2 * N * 5 + span_attention(W, 0, 5)))
    assert span_attention(W, 0, 5) == W * 5 * 6
