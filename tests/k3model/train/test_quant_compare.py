"""QAT vs PTQ (k3model/train/quant_compare.py): the quantization scopes, the held-out windows and
their metrics, and compare_scope's matched arms; the asset runs it end to end in
tests/assets/test_deploy.py."""

import copy

import pyarrow as pa
import pytest
import torch

from datagen.io import with_metadata
from datagen.sft import FORMAT
from k3model.train.sft import SFTConfig

from tests.k3model.test_model import smoke_model


def _demos(vocab=512, rows=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(4, vocab, (12,), generator=g).tolist() for _ in range(rows)]
    table = pa.table({"input_ids": ids, "loss_mask": [[0] * 4 + [1] * 8] * rows, "effort": ["low"] * rows,
                      "domain": ["general_tasks"] * rows, "harness": ["hermes"] * rows})
    return with_metadata(table, {"format": FORMAT})


def test_an_unknown_scope_is_refused_naming_the_valid_ones():
    from k3model.train.qat import prepare_qat

    with pytest.raises(ValueError, match="'everything' does not exist: use one of \\('experts', 'all_linear'\\)"):
        prepare_qat(smoke_model(1), scope="everything")
    with pytest.raises(ValueError, match="use one of"):
        SFTConfig(profile="smoke", qat_scope="dense")


def test_all_linear_scope_quantizes_every_linear_weight_with_the_one_quantizer():
    import torch.nn as nn
    import torch.nn.functional as F

    from kernels.mx import fake_quant_mx
    from k3model.train.qat import linear_fake_quant_enabled, prepare_qat, qat_enabled

    model = smoke_model(1)
    keys = list(model.state_dict())
    experts_only = prepare_qat(copy.deepcopy(model))
    assert qat_enabled(experts_only) and not linear_fake_quant_enabled(experts_only)
    prepare_qat(model, "floor", scope="all_linear")
    assert qat_enabled(model) and linear_fake_quant_enabled(model)
    assert list(model.state_dict()) == keys  # a checkpoint keeps its keys
    linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
    x = torch.randn(3, linear.in_features, requires_grad=True)
    y = linear(x)
    want = F.linear(x, fake_quant_mx(linear.weight, "fp4_e2m1", scale_rounding="floor"), linear.bias)
    assert torch.equal(y, want) and not torch.equal(y, F.linear(x, linear.weight, linear.bias))
    y.sum().backward()  # straight through: the master weight gets x's gradient
    assert torch.allclose(linear.weight.grad, torch.ones(3, linear.out_features).T @ x.detach())


@torch.no_grad()
def test_window_metrics_and_windows():
    from k3model.train.qat import prepare_qat
    from k3model.train.quant_compare import token_windows, window_metrics

    table = _demos(rows=4)
    windows = token_windows(table, 16, 3)
    assert windows.shape == (3, 16) and windows[0, :12].tolist() == table.column("input_ids")[0].as_py()
    with pytest.raises(ValueError, match="fewer than 5 windows × 16"):
        token_windows(table, 16, 5)
    reference = smoke_model(1)
    same = window_metrics(reference, reference, windows)
    assert same["kl_to_bf16"] == 0.0 and same["nll"] > 0
    quantized = window_metrics(reference, prepare_qat(copy.deepcopy(reference), scope="all_linear"), windows)
    assert quantized["kl_to_bf16"] > 1e-6 and quantized["nll"] != same["nll"]


def test_corpus_windows_read_the_held_out_split_end_to_end(smoke_tok):
    from datagen.corpus import split_texts
    from datagen.tokenizer import EOS, encode
    from k3model.train.quant_compare import corpus_windows

    texts = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota", "kappa lambda"]
    corpus = pa.table({"split": ["heldout", "train", "heldout", "heldout"], "source": ["prose"] * 4,
                       "text": texts})
    eos = smoke_tok.token_to_id(EOS)
    stream = [t for text in split_texts(corpus, "heldout") for t in (*encode(smoke_tok, text), eos)]
    windows = corpus_windows(corpus, smoke_tok, 3, 2)
    assert windows.tolist() == [stream[:3], stream[3:6]]  # training text never enters
    with pytest.raises(ValueError, match=f"fewer than 9 windows × {len(stream)}"):
        corpus_windows(corpus, smoke_tok, len(stream), 9)


def test_compare_scope_runs_matched_arms_per_seed_and_rounding(tmp_path):
    from k3model.train.quant_compare import compare_scope, token_windows

    cfg = SFTConfig(profile="smoke", steps=2, batch_size=2, log_every=1)
    out = compare_scope(cfg, _demos(), token_windows(_demos(rows=6, seed=1), 16, 4), tmp_path, scope="all_linear",
                        seeds=(0, 1), scale_roundings=("ceil", "floor"))
    assert out["scope"] == "all_linear" and out["windows"] == [4, 16] and set(out["seeds"]) == {"0", "1"}
    assert out["tokens"]["seed0/bf16"] == out["tokens"]["seed0/ceil/qat"] == out["tokens"]["seed1/floor/qat"]
    for per_seed in out["seeds"].values():
        for rounding in ("ceil", "floor"):
            for arm in ("qat", "ptq"):
                m = per_seed[rounding][arm]
                assert m["drop"] == pytest.approx(m["nll"] - per_seed["bf16"]["nll"]) and m["kl_to_bf16"] > 0
    # Different seeds train on different batches: the bf16 arms differ.
    assert out["seeds"]["0"]["bf16"]["nll"] != out["seeds"]["1"]["bf16"]["nll"]
    with pytest.raises(ValueError, match="use one of"):
        compare_scope(cfg, _demos(), token_windows(_demos(), 8, 2), tmp_path, scope="dense")
