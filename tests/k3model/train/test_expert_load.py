"""k3model.train.expert_load: claim 2's held-out expert load — hand-computed statistics, a planted
bias that the measurement sees and the zeroed arm removes, and a fixed mixed set of the three row kinds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import datagen
from datagen.build import build_all
from k3model.config import get_profile
from k3model.model import K3Model
from k3model.train.pretrain_data import PretrainData
from k3model.train.expert_load import MixedSet, checkpoint_expert_load, expert_load, load_stats, mixed_heldout_set


def test_load_stats_by_hand():
    loads = torch.tensor([[4.0, 4.0, 4.0, 4.0], [10.0, 2.0, 0.1, 3.9]])
    s = load_stats(loads, top_k=2)
    assert s["load_max_over_mean"] == pytest.approx((1.0 + 2.5) / 2)
    assert s["load_max_over_mean_worst"] == pytest.approx(2.5)
    assert s["dead_experts"] == 1 and s["dead_fraction"] == pytest.approx(1 / 8)  # 0.1 < 0.1 × 4
    with pytest.raises(ValueError, match="routed no tokens"):
        load_stats(torch.zeros(1, 4), top_k=2)


def _random_set(vocab: int) -> MixedSet:
    g = torch.Generator().manual_seed(0)
    return MixedSet([("text", torch.randint(0, vocab, (4, 64), generator=g), None, None) for _ in range(3)])


def test_a_planted_bias_shows_and_the_zeroed_arm_removes_it():
    torch.manual_seed(0)
    model = K3Model(replace(get_profile("smoke").model, vision=None))
    heldout = _random_set(model.cfg.vocab_size)
    plain = expert_load(model, heldout)
    for m in model.moe_layers():
        m.expert_bias_E[0] = 10.0  # every token now picks expert 0
    measured = checkpoint_expert_load(model, heldout)
    E, k = model.cfg.n_routed, model.cfg.top_k
    # Expert 0 takes every token: load T against a mean of k·T/E.
    assert measured["with_bias"]["load_max_over_mean"] == pytest.approx(E / k)
    assert measured["with_bias"]["per_batch"]["sd"] == pytest.approx(0.0, abs=1e-12)
    assert measured["bias_zeroed"]["load_max_over_mean"] == pytest.approx(plain["load_max_over_mean"])
    assert measured["with_bias"]["tokens"] == 3 * 4 * 64
    assert all(float(m.expert_bias_E[0]) == 10.0 for m in model.moe_layers())  # restored
    # A model with every bias at 0 (trained with balancing none): one pass serves both arms.
    for m in model.moe_layers():
        m.expert_bias_E.zero_()
    unbiased = checkpoint_expert_load(model, heldout)
    assert unbiased["bias_zeroed"] == unbiased["with_bias"]
    assert unbiased["with_bias"]["load_max_over_mean"] == pytest.approx(plain["load_max_over_mean"])


def test_dead_experts_are_counted():
    torch.manual_seed(0)
    model = K3Model(replace(get_profile("smoke").model, vision=None))
    for m in model.moe_layers():
        m.expert_bias_E[-1] = -10.0  # never picked
    measured = expert_load(model, _random_set(model.cfg.vocab_size))
    assert measured["dead_experts"] >= len(model.moe_layers())
    assert measured["dead_fraction"] >= 1 / model.cfg.n_routed


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    cfg = datagen.presets("smoke")
    build_all(cfg, out)
    return PretrainData(out / "tokenizer.json", out / "corpus.parquet", out / "images.parquet",
                        out / "clue_eval.parquet", clues=cfg.clues)


def test_the_mixed_set_is_fixed_and_holds_all_three_kinds(smoke_data):
    cfg = get_profile("smoke").model
    a = mixed_heldout_set(smoke_data, cfg.vision.tokens_per_image, text_tokens=2048, clue_tokens=1024,
                          image_rows_tokens=512, text_length=128)
    b = mixed_heldout_set(smoke_data, cfg.vision.tokens_per_image, text_tokens=2048, clue_tokens=1024,
                          image_rows_tokens=512, text_length=128)
    assert {k for k, *_ in a.batches} == {"text", "clue", "image"}
    assert a.tokens("text") == 2048 and 0 < a.tokens("clue") <= 1024 and 0 < a.tokens("image") <= 512
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a.batches, b.batches))
    for kind, ids, images, mask in a.batches:
        if kind == "image":
            assert int(mask.sum()) == images.shape[0] * cfg.vision.tokens_per_image
    torch.manual_seed(0)
    measured = checkpoint_expert_load(K3Model(cfg), a)
    assert set(measured["with_bias"]["by_kind"]) == {"text", "clue", "image"}
    assert measured["with_bias"]["tokens"] == a.tokens()
