"""datagen.packing: exact row lengths, loss mask, image placeholders matching image ids, clue rows,
VQA eval prompts, determinism."""

from dataclasses import replace

import numpy as np
import pytest

from datagen.clues import solve
from datagen.packing import PackingConfig, pack_pretraining, vqa_eval_set
from datagen.tokenizer import IMAGE, IMAGE_END, IMAGE_START, PAD, decode


@pytest.fixture(scope="module")
def packed(cfg, tok, corpus, images):
    return pack_pretraining(cfg.packing, cfg.clues, 128, 96, tokenizer=tok, corpus=corpus, images=images)


def test_rows_and_masks(cfg, tok, images, packed):
    image_id, pad = tok.token_to_id(IMAGE), tok.token_to_id(PAD)
    split = dict(zip(images.column("image_id").to_pylist(), images.column("split").to_pylist()))
    kinds = packed.column("kind").to_pylist()
    assert set(kinds) == {"text", "clue", "image"}
    for row in packed.to_pylist():
        ids, mask = np.array(row["input_ids"]), np.array(row["loss_mask"])
        assert len(ids) == len(mask) == 128
        assert np.array_equal(mask == 0, (ids == image_id) | (ids == pad))
        # N placeholders per image, one image block per image id, all from the train split.
        assert (ids == image_id).sum() == cfg.packing.image_tokens * len(row["image_ids"])
        assert (ids == tok.token_to_id(IMAGE_START)).sum() == len(row["image_ids"])
        assert all(split[i] == "train" for i in row["image_ids"])
        if row["kind"] == "clue":
            answer = decode(tok, ids[row["answer_start"] : row["answer_end"]]).strip()
            assert solve(decode(tok, ids[: row["answer_start"]])) == answer
            assert row["distance"] >= 0
        else:
            assert row["answer_start"] == row["answer_end"] == row["distance"] == -1
        if row["kind"] != "image":
            assert not row["image_ids"] and pad not in ids


def test_image_blocks_are_whole(cfg, tok, packed):
    start, end = tok.token_to_id(IMAGE_START), tok.token_to_id(IMAGE_END)
    n = cfg.packing.image_tokens
    for row in packed.to_pylist():
        ids = row["input_ids"]
        for i, t in enumerate(ids):
            if t == start:
                assert ids[i + 1 : i + 2 + n] == [tok.token_to_id(IMAGE)] * n + [end]


def test_text_rows_are_consecutive_windows(tok, packed):
    texts = [r["input_ids"] for r in packed.to_pylist() if r["kind"] == "text"]
    assert len(texts) >= 2 and texts[0] != texts[1]


def test_deterministic_and_seeded(cfg, tok, corpus, images):
    def pack(c):
        return pack_pretraining(c, cfg.clues, 64, 24, tokenizer=tok, corpus=corpus, images=images)

    a, b, c = pack(cfg.packing), pack(cfg.packing), pack(replace(cfg.packing, seed=5))
    assert a.equals(b) and not a.equals(c)


def test_more_rows_extend_fewer_rows(cfg, tok, corpus, images):
    # Row i does not depend on how many rows were asked for, so a longer run replays a shorter one.
    def pack(n):
        return pack_pretraining(cfg.packing, cfg.clues, 64, n, tokenizer=tok, corpus=corpus, images=images)

    assert pack(40).slice(0, 16).equals(pack(16))


def test_too_short_for_an_image_raises(cfg, tok, corpus, images):
    only_images = replace(cfg.packing, image_fraction=1.0, clue_fraction=0.0)
    with pytest.raises(ValueError, match="image document"):
        pack_pretraining(only_images, cfg.clues, 8, 2, tokenizer=tok, corpus=corpus, images=images)


def test_vqa_eval_set(cfg, tok, images):
    t = vqa_eval_set(cfg.packing, tokenizer=tok, images=images)
    split = dict(zip(images.column("image_id").to_pylist(), images.column("split").to_pylist()))
    rows = t.to_pylist()
    assert rows and all(split[r["image_id"]] == "heldout" for r in rows)
    for r in rows:
        assert r["prompt_ids"].count(tok.token_to_id(IMAGE)) == cfg.packing.image_tokens
        assert decode(tok, r["prompt_ids"]).endswith(f"\nQuestion: {r['question']}\nAnswer:")
        assert decode(tok, r["answer_ids"]) == " " + r["answer"]


def test_config_errors():
    with pytest.raises(ValueError, match="lower one"):
        PackingConfig(clue_fraction=0.6, image_fraction=0.6)
    with pytest.raises(ValueError, match="image_tokens"):
        PackingConfig(image_tokens=0)
