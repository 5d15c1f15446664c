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
