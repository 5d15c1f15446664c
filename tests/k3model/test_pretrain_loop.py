"""Pretraining: the loss falls on the tiny profile, resume is exact, bad config is rejected."""

import dataclasses

import pytest
import torch

import datagen
from datagen.build import build_all
from k3model.checkpoint import load_checkpoint
from k3model.train.pretrain import BALANCING_ARM_STEPS, PretrainConfig, balancing_arms, train
from k3model.train.pretrain_data import PretrainData, StageBatches
from k3model.config import get_profile
from k3model.model import K3Model
from k3model.schedule import lr_at, stage_lr_at


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    cfg = datagen.presets("smoke")
    build_all(cfg, out)
    return PretrainData(out / "tokenizer.json", out / "corpus.parquet", out / "images.parquet",
                        out / "clue_eval.parquet", clues=cfg.clues)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    lrs = [lr_at(s, 100, 1.0, 10, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_the_steps_after_the_clue_warmup_get_a_schedule_of_their_own():
    """StageConfig.mixed_lr: the clue-only steps keep the stage's schedule; the mixed steps after
    them warm up again from near 0 to mixed_lr and decay to its floor."""
    one = [stage_lr_at(s, 1000, 3e-3, 100, 0.1) for s in range(1000)]
    two = [stage_lr_at(s, 1000, 3e-3, 100, 0.1, switch_step=400, second_peak_lr=1e-3) for s in range(1000)]
    assert one == [lr_at(s, 1000, 3e-3, 100, 0.1) for s in range(1000)]
    assert two[:400] == one[:400] and one[400] > 2e-3
    assert two[400] == pytest.approx(1e-3 / 60) and max(two[400:]) == pytest.approx(1e-3)
    assert two.index(max(two[400:])) == 459 and two[-1] == pytest.approx(1e-4, rel=1e-2)
    assert all(a >= b for a, b in zip(two[459:], two[460:]))
    assert PretrainConfig(profile="tiny", stage=1).resolved().mixed_lr == 1e-3
    assert PretrainConfig(profile="tiny", stage=1, mixed_lr=0).resolved().mixed_lr is None
    with pytest.raises(ValueError, match="mixed_lr"):
        PretrainConfig(profile="smoke", stage=1, mixed_lr=-1e-3)


def test_the_loop_trains_the_mixed_steps_at_their_own_lr(smoke_data, tmp_path):
    cfg = PretrainConfig(profile="smoke", stage=1, steps=6, clue_warmup_steps=3, mixed_lr=1e-3, log_every=1,
                         eval_examples_per_cell=1, eval_ppl_windows=2, eval_vqa_questions=4, eval_max_length=64)
    lrs = [h["train/lr"] for h in train(cfg, smoke_data, tmp_path).history]
    peak = get_profile("smoke").stages[0].lr
    assert lrs == [pytest.approx(stage_lr_at(s, 6, peak, 1, 0.1, 3, 1e-3)) for s in range(6)]
    assert lrs[3] == pytest.approx(1e-3) and lrs[2] != pytest.approx(1e-3)


@pytest.mark.slow
def test_fifty_tiny_steps_make_the_loss_fall(smoke_data, tmp_path):
    # No clue-only warm-up: 50 steps of it would leave the text unlearned (the perplexity bar below).
    cfg = PretrainConfig(profile="tiny", stage=1, steps=50, batch_size=8, eval_examples_per_cell=1, eval_ppl_windows=2, eval_vqa_questions=4,
                         eval_max_length=64, log_every=50, clue_warmup_steps=0)
    result = train(cfg, smoke_data, tmp_path)
    first = sum(h["train/main"] for h in result.history[:5]) / 5
    last = sum(h["train/main"] for h in result.history[-5:]) / 5
    assert last < first - 1.5, (first, last)
    assert result.eval["eval/ppl"] < 400
    assert 0.0 <= result.eval["eval/vqa_acc"] <= 1.0
    assert any(k.startswith("eval/clue_acc/scattered/") for k in result.eval)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_killed_run_resumes_and_ends_where_an_uninterrupted_one_does(smoke_data, tmp_path, optimizer):
    cfg = PretrainConfig(profile="smoke", stage=1, steps=4, ckpt_every=2, eval_examples_per_cell=1, eval_ppl_windows=2, eval_vqa_questions=4,
                         eval_max_length=64, optimizer=optimizer)
    full = train(cfg, smoke_data, tmp_path / "full")
    partial = train(cfg, smoke_data, tmp_path / "killed", stop_after=3)  # dies after step 3
    assert partial.eval == {}
    resumed = train(cfg, smoke_data, tmp_path / "killed")
    assert resumed.resumed_from_step == 2
    a, _ = load_checkpoint(full.checkpoint_dir)
    b, _ = load_checkpoint(resumed.checkpoint_dir)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [h["train/main"] for h in full.history] == [h["train/main"] for h in resumed.history]
    assert full.eval["moe/train_tail_load_max_over_mean"] == resumed.eval["moe/train_tail_load_max_over_mean"]
    stage = get_profile("smoke").stages[0]
    # The last 10 % of 4 steps' tokens lie in step 4: one step's tokens.
    assert full.eval["moe/train_tail_tokens"] == stage.batch_size * stage.seq_len


def test_next_stage_starts_from_the_previous_weights(smoke_data, tmp_path):
    s1 = train(PretrainConfig(profile="smoke", stage=1, steps=1, eval_examples_per_cell=1, eval_ppl_windows=2, eval_vqa_questions=4,
                              eval_max_length=64), smoke_data, tmp_path / "s1")
    s2 = train(PretrainConfig(profile="smoke", stage=2, steps=1, eval_examples_per_cell=1, eval_ppl_windows=2, eval_vqa_questions=4,
                              eval_max_length=64, lr=1e-12), smoke_data, tmp_path / "s2",
               init_checkpoint=s1.checkpoint_dir)
    w1, _ = load_checkpoint(s1.checkpoint_dir)
    w2, manifest = load_checkpoint(s2.checkpoint_dir)
    # With a vanishing learning rate the stage-2 weights are the stage-1 weights.
    assert torch.allclose(w1["embed.weight"], w2["embed.weight"], atol=1e-6)
    assert manifest["config"]["resolved"]["seq_len"] == get_profile("smoke").stages[1].seq_len
    assert set(manifest["data_versions"]) == {"tokenizer_path", "corpus_path", "images_path", "clue_eval_path"}


def test_batches_carry_images_in_placeholder_order(smoke_data):
    cfg = get_profile("smoke").model
    batches = StageBatches(smoke_data, cfg, seq_len=128, batch_size=4, seed=0, stage=2,
                           clue_fraction=0.0, image_fraction=1.0)
    batches.pack(4)
    batch = batches.batch(0)
    assert batch.images is not None
    assert int(batch.image_mask.sum()) == batch.images.shape[0] * cfg.vision.tokens_per_image
    # Placeholders are never targets.
    assert not (batch.labels[:, :-1][batch.image_mask[:, 1:]] != -100).any()


@pytest.mark.parametrize("field, value", [("stage", 5), ("profile", "giant"), ("steps", 0),
                                          ("clue_fraction", 1.5), ("optimizer", "sgd"), ("balancing", "off"),
                                          ("quantile_window_tokens", -1)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field if field != "profile" else "unknown profile"):
        PretrainConfig(**{field: value})


def test_balancing_arms_differ_only_in_balancing_and_refuse_bad_values():
    arms = balancing_arms("tiny")
    assert list(arms) == ["quantile", "none"]
    a, b = (dataclasses.asdict(c) for c in arms.values())
    assert {k for k in a if a[k] != b[k]} == {"balancing"}
    assert a["steps"] == BALANCING_ARM_STEPS["tiny"] and a["clue_warmup_steps"] == 0 and a["stage"] == 1
    assert arms["none"].resolved().model.balancing == "none"
    assert list(balancing_arms("smoke", balanced="deepseek", steps=2)) == ["deepseek", "none"]
    with pytest.raises(ValueError, match="needs a balancing that balances.*got 'none'"):
        balancing_arms("tiny", balanced="none")
    with pytest.raises(ValueError, match=r"steps must lie in \[1, 1300\].*got 0"):
        balancing_arms("tiny", steps=0)
    with pytest.raises(ValueError, match=r"steps must lie in \[1, 4\].*got 5"):
        balancing_arms("smoke", steps=5)


def test_quantile_window_is_the_stages_unless_overridden():
    # tiny: stage 1 keeps K3's overwrite (a router from random weights drifts faster than a window
    # follows), stages 2–4 average ≈ 32K tokens (docs/log/pretrain.md 2026-12-06).
    assert [PretrainConfig(profile="tiny", stage=s).resolved().model.quantile_window_tokens
            for s in (1, 2, 3, 4)] == [0, 32_768, 32_768, 32_768]
    assert PretrainConfig(profile="tiny", stage=3, quantile_window_tokens=0).resolved().model.quantile_window_tokens == 0
    assert PretrainConfig(profile="tiny", stage=1, quantile_window_tokens=4096).resolved().model.moe().quantile_window_tokens == 4096


@pytest.mark.parametrize("gib, checkpointing", [(80, True), (141, True), (192, False)])
def test_small_stage_1_keeps_checkpointing_on_a_gpu_too_small_to_go_without(monkeypatch, gib, checkpointing):
    # small's stage 1 trains without checkpointing only where the GPU holds it: not on an 80 GB H100
    # nor a 141 GB H200, where it ran out of memory (docs/log/gpu.md).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: type("Props", (), {"total_memory": gib * 2**30})())
    stage = PretrainConfig(profile="small", stage=1).resolved()
    assert stage.device == "cuda" and stage.model.activation_checkpointing is checkpointing
    assert bool(stage.notes) is checkpointing and (not checkpointing or f"{gib} GiB" in stage.notes[0])
    assert PretrainConfig(profile="small", stage=2).resolved().model.activation_checkpointing is True


def test_missing_data_says_which_asset_to_materialize(tmp_path):
    with pytest.raises(ValueError, match="tokenizer_path.*materialize"):
        PretrainData(tmp_path / "nope.json", tmp_path, tmp_path, tmp_path)


SHORT_EVAL = dict(eval_examples_per_cell=1, eval_ppl_windows=2, eval_vqa_questions=4, eval_max_length=64)


@pytest.mark.parametrize("field, value, message", [
    ("lr", float("inf"), "lr must be a finite number, got inf"),
    ("lr", float("nan"), "lr must be a finite number, got nan"),
    ("warmup_frac", float("nan"), "warmup_frac must be a finite number"),
    ("grad_clip", 0.0, "grad_clip must be > 0"),
    ("weight_decay", -0.1, "weight_decay must be ≥ 0"),
    ("min_lr_ratio", 2.0, r"min_lr_ratio must lie in \[0, 1\]")])
def test_non_finite_or_out_of_range_floats_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        PretrainConfig(profile="smoke", **{field: value})


def test_steps_and_batch_size_are_bounded_by_the_machine():
    with pytest.raises(ValueError, match=r"batch_size 1000000000 × seq_len 64 needs at least .* GiB per step .* "
                                         r"more than this machine's .* lower batch_size"):
        PretrainConfig(profile="smoke", batch_size=10**9).resolved()
    with pytest.raises(ValueError, match=r"steps 10000000000000 × batch_size 4 rows of 64 tokens need at least "
                                         r".* GiB to pack, more than this machine's .* lower steps"):
        PretrainConfig(profile="smoke", steps=10**13).resolved()
    assert PretrainConfig(profile="tiny", stage=4).resolved().steps == get_profile("tiny").stages[3].steps


def test_a_diverging_stage_fails_and_keeps_no_checkpoint_of_it(smoke_data, tmp_path):
    cfg = PretrainConfig(profile="smoke", stage=1, steps=4, lr=1e30, warmup_frac=1.0, **SHORT_EVAL)
    with pytest.raises(FloatingPointError, match=r"stage 1 diverged: train/\w+ is (nan|inf) at step \d"):
        train(cfg, smoke_data, tmp_path)
    assert not (tmp_path / "final").exists()


def test_a_damaged_resume_checkpoint_restarts_the_stage(smoke_data, tmp_path):
    cfg = PretrainConfig(profile="smoke", stage=1, steps=4, ckpt_every=2, **SHORT_EVAL)
    partial = train(cfg, smoke_data, tmp_path, stop_after=3)  # "killed" after step 3, last/ at step 2
    weights = tmp_path / "last" / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.warns(RuntimeWarning, match="resume checkpoint .* is damaged"):
        result = train(cfg, smoke_data, tmp_path)
    assert result.resumed_from_step is None and [h["step"] for h in result.history] == [1, 2, 3, 4]
    # Started over from the stage's start: the same steps as the first attempt.
    assert [h["train/main"] for h in result.history[:3]] == [h["train/main"] for h in partial.history]
    assert load_checkpoint(result.checkpoint_dir)[1]["metrics"]["train/final_loss"] > 0
    assert any(p.name.startswith("last.damaged-") for p in tmp_path.iterdir())


def test_clue_rows_train_on_their_answers_with_their_own_mean(smoke_data):
    """clue_loss="answer": a clue row's targets are its answer and <|eos|> only, text rows keep every
    target, and the main loss is the answer targets' mean plus the rest's mean."""
    cfg = get_profile("smoke").model
    rows = {}
    for clue_loss in ("answer", "all"):
        b = StageBatches(smoke_data, cfg, seq_len=64, batch_size=8, seed=0, stage=1, clue_fraction=0.5,
                         image_fraction=0.0, clue_loss=clue_loss)
        b.pack(8)
        rows[clue_loss] = (b, b.batch(0))
    b, batch = rows["answer"]
    _, full = rows["all"]
    assert full.answer_mask is None and torch.equal(batch.input_ids, full.input_ids)
    kinds = b._rows["kind"][:8]
    assert "clue" in kinds and "text" in kinds
    valid = batch.labels != -100
    for r, kind in enumerate(kinds):
        if kind == "text":
            assert torch.equal(batch.labels[r], full.labels[r]) and not batch.answer_mask[r].any()
        else:
            # Exactly the answer's targets: read from one before the answer's first token to <|eos|>.
            assert torch.equal(valid[r], batch.answer_mask[r])
            eos = smoke_data.tokenizer.token_to_id("<|eos|>")
            assert batch.labels[r][valid[r]][-1] == eos and 3 <= int(valid[r].sum()) < 30
    torch.manual_seed(0)
    model = K3Model(cfg)
    losses = model.compute_loss(batch.input_ids, batch.labels, answer_mask_BT=batch.answer_mask)
    logits = model(batch.input_ids).logits_BTV.float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.labels, ignore_index=-100,
                                            reduction="none")
    answer, rest = batch.answer_mask & valid, valid & ~batch.answer_mask
    expected = nll[answer].mean() + nll[rest].mean()
    assert torch.allclose(losses["loss/main"], expected, rtol=1e-5)
    assert torch.allclose(losses["loss/answer"], nll[answer].mean(), rtol=1e-5)


def test_clue_warmup_rows_are_clue_rows_then_the_stage_mix(smoke_data):
    """StageConfig.clue_warmup_steps: the first rows are clue rows only; the rows after them are the
    stage's usual mix, the same rows a stage without a warm-up packs first."""
    cfg = get_profile("smoke").model
    kw = dict(seq_len=64, batch_size=8, seed=0, stage=1, clue_fraction=0.3, image_fraction=0.0)
    warm = StageBatches(smoke_data, cfg, clue_warmup_rows=16, **kw)
    warm.pack(40)
    plain = StageBatches(smoke_data, cfg, **kw)
    plain.pack(24)
    assert warm._rows["kind"][:16] == ["clue"] * 16
    assert warm._rows["kind"][16:] == plain._rows["kind"] and "text" in plain._rows["kind"]
    assert (warm._rows["input_ids"][16:] == plain._rows["input_ids"]).all()
    with pytest.raises(ValueError, match="clue_warmup_steps"):
        PretrainConfig(profile="smoke", stage=1, clue_warmup_steps=-1)


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits_BTV[0, -1].argmax()))
    return ids[len(prompt):]


def test_batched_answer_scoring_equals_one_row_at_a_time(smoke_data):
    """answers_are_argmax (one batch, the head at the answer positions only) scores each row as
    answer_is_argmax does: hits where the answer is the model's own greedy continuation, misses where
    one token of it (the last, or the first) is changed."""
    from k3model.train.pretrain_eval import answer_is_argmax, answers_are_argmax

    torch.manual_seed(0)
    model = K3Model(get_profile("smoke").model).eval()
    grid = smoke_data.clue_eval.to_pydict()
    rows = [i for i, n in enumerate(grid["length_target"]) if n == 128][:3]
    prompts, answers, expected = [], [], []
    for i in rows:
        prompt, n = grid["prompt_ids"][i], len(grid["answer_ids"][i])
        greedy = _greedy(model, prompt, n)
        wrong_last = greedy[:-1] + [(greedy[-1] + 1) % model.cfg.vocab_size]
        wrong_first = [(greedy[0] + 1) % model.cfg.vocab_size] + greedy[1:]
        for answer, hit in ((greedy, True), (wrong_last, False), (wrong_first, False)):
            prompts.append(prompt)
            answers.append(answer)
            expected.append(hit)
    one_by_one = [answer_is_argmax(model, p, a, "cpu") for p, a in zip(prompts, answers)]
    assert one_by_one == expected
    assert answers_are_argmax(model, prompts, answers, "cpu") == expected
    with pytest.raises(ValueError, match="share prompt \\+ answer length"):
        answers_are_argmax(model, [prompts[0], prompts[0][:-1]], answers[:2], "cpu")


def test_clue_accuracy_records_the_count_behind_every_rate(smoke_data):
    from k3model.train.pretrain_eval import clue_accuracy

    torch.manual_seed(0)
    model = K3Model(get_profile("smoke").model)
    ev = clue_accuracy(model, smoke_data, "cpu", examples_per_cell=2, max_length=128)
    cells = {k for k in ev if k.startswith("eval/clue_acc/scattered/len")  and k.count("/") == 4}
    assert cells and all(ev[k.replace("clue_acc", "clue_n")] == 2 for k in cells)
    for variant in ("scattered", "control"):
        assert ev[f"eval/clue_n/{variant}/all"] == 2 * len(cells)
        assert ev[f"eval/clue_n/{variant}/len128"] == 2 * sum("len128/" in k for k in cells)
    for k, v in ev.items():
        if k.startswith("eval/clue_acc/"):
            n = ev[k.replace("clue_acc", "clue_n")]
            assert abs(v * n - round(v * n)) < 1e-9
    whole = clue_accuracy(model, smoke_data, "cpu", examples_per_cell=None, max_length=64)
    assert whole["eval/clue_n/scattered/len64"] == smoke_data.clues.eval_per_cell


def test_a_stage_sets_activation_checkpointing_for_its_model(monkeypatch):
    import k3model.train.pretrain as pretrain

    monkeypatch.setattr(pretrain, "check_fits_machine", lambda *args: None)  # the small profile on a laptop
    small = get_profile("small")
    assert small.model.activation_checkpointing and small.stages[0].activation_checkpointing is False
    assert PretrainConfig(profile="small", stage=1).resolved().model.activation_checkpointing is False
    assert PretrainConfig(profile="small", stage=2).resolved().model.activation_checkpointing is True
    assert PretrainConfig(profile="tiny", stage=1).resolved().model == get_profile("tiny").model


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_compiled_regions_are_refused_without_a_gpu():
    with pytest.raises(ValueError, match="compile_regions compiles for CUDA"):
        PretrainConfig(profile="smoke", compile_regions=True).resolved()
