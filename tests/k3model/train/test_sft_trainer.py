"""SFT: the loss on the model's own tokens falls, QAT is on from the first step (prepared from outside
the model, equal to a QAT-built model), resume is exact, bad input is rejected."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest
import torch

from datagen.sft import SFTDataConfig, build_sft
from k3model.checkpoint import load_checkpoint
from k3model.config import get_profile
from k3model.model import IGNORE_INDEX, K3Model
from k3model.train.qat import prepare_qat, qat_enabled
from k3model.train.sft import Demonstrations, SFTConfig, train

SMOKE = dict(profile="smoke", batch_size=2, lr=3e-3, log_every=4)


def test_loss_on_own_tokens_falls_with_qat_on_from_the_first_step(demos, smoke_tok, tmp_path):
    held_out = build_sft(SFTDataConfig(seed=1, tasks_per_family=1, families=("arith_word",)), smoke_tok)
    result = train(SFTConfig(steps=8, **SMOKE), demos, tmp_path, eval_demos=held_out)
    losses = [h["train/main"] for h in result.history]
    assert len(losses) == 8
    assert sum(losses[-3:]) / 3 < losses[0] - 0.8, losses
    for prefix in ("fit", "eval"):
        assert {f"{prefix}/loss/{e}" for e in ("low", "high", "max")} <= set(result.metrics)
        assert f"{prefix}/loss/general_tasks/max" in result.metrics
    assert result.metrics["eval/loss"] < losses[0] - 0.4  # other tasks of the family: the format is learnt
    _, manifest = load_checkpoint(result.checkpoint_dir)
    assert manifest["config"]["qat"]["weights"] == "fp4_e2m1"
    assert manifest["config"]["qat"]["activations"] == "fp8_e4m3"


def test_labels_are_the_next_token_only_where_it_is_the_models_own(demos):
    data = Demonstrations(demos, vocab_size=512)
    ids_BT, labels_BT = data.batch([0, 3])
    for b, r in enumerate([0, 3]):
        ids, own = data.ids[r], data.own[r]
        n = len(ids)
        assert torch.equal(ids_BT[b, :n], ids)
        want = torch.where(own[1:], ids[1:], IGNORE_INDEX)
        assert torch.equal(labels_BT[b, : n - 1], want)
        assert (labels_BT[b, n - 1:] == IGNORE_INDEX).all()  # padding and the last token: no target
    assert int((labels_BT != IGNORE_INDEX).sum()) == sum(int(data.own[r][1:].sum()) for r in (0, 3))
    # Batches are a pure function of (seed, step) and cover every row once per epoch.
    assert data.rows(0, 1, 2) == data.rows(0, 1, 2)
    assert sorted(data.rows(0, 0, 6)) == list(range(6))


def test_prepare_qat_from_outside_equals_a_model_built_with_qat():
    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0)
    torch.manual_seed(0)
    plain = K3Model(cfg)
    built = K3Model(replace(cfg, qat=True))
    built.load_state_dict(plain.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (2, 40))
    before = plain(ids).logits_BTV
    assert not qat_enabled(plain)
    prepare_qat(plain)
    assert qat_enabled(plain)
    after = plain(ids).logits_BTV
    assert not torch.equal(before, after)
    assert torch.equal(after, built(ids).logits_BTV)


def test_a_killed_run_resumes_and_ends_where_an_uninterrupted_one_does(demos, tmp_path):
    cfg = SFTConfig(steps=4, ckpt_every=2, **SMOKE)
    full = train(cfg, demos, tmp_path / "full")
    train(cfg, demos, tmp_path / "killed", stop_after=3)
    resumed = train(cfg, demos, tmp_path / "killed")
    assert resumed.resumed_from_step == 2
    a, _ = load_checkpoint(full.checkpoint_dir)
    b, _ = load_checkpoint(resumed.checkpoint_dir)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [h["train/main"] for h in full.history] == [h["train/main"] for h in resumed.history]


def test_bad_input_says_what_to_change(demos, tmp_path):
    with pytest.raises(ValueError, match="steps"):
        SFTConfig(steps=0)
    with pytest.raises(ValueError, match="never instantiated"):
        SFTConfig(profile="k3")
    with pytest.raises(ValueError, match="build them first"):
        train(SFTConfig(steps=1, **SMOKE), tmp_path / "missing.parquet", tmp_path)
    with pytest.raises(ValueError, match="vocabulary"):
        Demonstrations(demos, vocab_size=100)
    with pytest.raises(ValueError, match="build_sft"):
        Demonstrations(pa.table({"input_ids": [[1, 2]]}), vocab_size=512)
    no_moe = replace(get_profile("smoke").model, vision=None, n_layers=1, n_dense_layers=1)
    with pytest.raises(ValueError, match="no LatentMoE"):
        prepare_qat(K3Model(no_moe))


def test_replay_floors_are_per_row_probabilities_of_the_demonstration(demos):
    """p_demo is the mean over rows of Π p(own token); greedy_match the share of rows whose every own
    token is the argmax — computed here row by row, one sequence at a time (no padding)."""
    from k3model.train.sft import demo_loss
    torch.manual_seed(0)
    model = K3Model(get_profile("smoke").model).eval()
    # Two own tokens per row, so that the product of probabilities does not underflow.
    masks = []
    for mask in demos.column("loss_mask").to_pylist():
        keep = [i for i, x in enumerate(mask) if x][:2]
        masks.append([int(i in keep) for i in range(len(mask))])
    short = demos.set_column(demos.schema.get_field_index("loss_mask"), "loss_mask",
                             pa.array(masks, demos.schema.field("loss_mask").type)).replace_schema_metadata(
                                 demos.schema.metadata)
    data = Demonstrations(short, model.cfg.vocab_size)
    m = demo_loss(model, data, batch_size=3)
    probs, matches = [], []
    with torch.no_grad():
        for r in range(len(data)):
            ids_1T, labels_1T = data.batch([r])
            logp_TV = torch.log_softmax(model(ids_1T).logits_BTV.float()[0], -1)
            own = labels_1T[0] != IGNORE_INDEX
            probs.append(float(logp_TV[own].gather(1, labels_1T[0][own, None]).sum().exp()))
            matches.append(float(bool((logp_TV[own].argmax(-1) == labels_1T[0][own]).all())))
    assert max(probs) > 0  # not every row underflows: the comparison below means something
    assert m["eval/p_demo"] == pytest.approx(sum(probs) / len(probs), rel=1e-3, abs=0)
    assert m["eval/greedy_match"] == sum(matches) / len(matches)
