"""Packing corpus text, scattered-clue examples and image documents into fixed-length pretraining rows.

Each row of a stage's table is exactly `seq_len` tokens and one of three kinds, drawn per row with
probabilities (clue_fraction, image_fraction, rest):
- `text`: a contiguous window of the train split's token stream (documents in a seeded order, each
  followed by <|eos|>), windows taken one after another from a seeded start and wrapping around;
- `clue`: one scattered-clue training example of exactly `seq_len` tokens (datagen.clues);
- `image`: image documents packed whole (the first of the next few that fits) until none fits,
  the tail padded with <|pad|>. An image document is
      <|image_start|> <|image|>×N <|image_end|> then either the caption or Question/Answer lines, <|eos|>
  with N = `image_tokens` (the vision encoder's tokens per image after its 2×2 merge); the vision
  tokens replace the <|image|> embeddings in order, image i of the row being `image_ids[i]`.

Columns: input_ids [seq_len] int32; loss_mask [seq_len] uint8, where loss_mask[t] = 1 means token t is
a prediction target (0 on <|image|> slots and padding); kind; image_ids (image_id values of the
image table, in slot order); answer_start/answer_end (a clue row's answer span, else -1);
distance (a clue row's clue distance, else -1). Row i does not depend on `n_sequences`, so packing
more rows extends the table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from datagen.clues import CluesConfig, build_filler, clue_training_examples
from datagen.corpus import split_texts
from datagen.io import with_metadata
from datagen.seeding import rng as make_rng
from datagen.tokenizer import (
    BOS,
    EOS,
    IMAGE,
    IMAGE_END,
    IMAGE_START,
    PAD,
    encode,
    encode_batch,
)

ROW_KINDS = ("text", "clue", "image")
# Pending image documents searched for one that fits the rest of a row, before padding the row.
_IMAGE_LOOKAHEAD = 8


@dataclass(frozen=True)
class PackingConfig:
    seed: int = 0
    # <|image|> slots per image: the vision encoder's token count after its 2×2 merge
    # (datagen.images.image_token_count(image_size, patch_size)).
    image_tokens: int = 4
    clue_fraction: float = 0.25
    image_fraction: float = 0.15
    # Image documents that show the caption; the rest show Question/Answer lines only, so the answer
    # has to come from the image.
    caption_fraction: float = 0.5

    def __post_init__(self):
        if self.image_tokens < 1:
            raise ValueError(f"image_tokens must be >= 1, got {self.image_tokens}")
        for name in ("clue_fraction", "image_fraction", "caption_fraction"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        if self.clue_fraction + self.image_fraction > 1.0:
            raise ValueError(
                f"clue_fraction + image_fraction = {self.clue_fraction + self.image_fraction} > 1; "
                "lower one of them"
            )


def image_block(tokenizer: Tokenizer, image_tokens: int) -> list[int]:
    """<|image_start|> <|image|>×image_tokens <|image_end|> as ids."""
    ids = tokenizer.token_to_id
    return [ids(IMAGE_START)] + [ids(IMAGE)] * image_tokens + [ids(IMAGE_END)]


def qa_text(question: str, answer: str) -> tuple[str, str]:
    """The prompt and answer text of one visual question, in the clue data's Question/Answer format."""
    return f"\nQuestion: {question}\nAnswer:", f" {answer}"


def _image_documents(
    cfg: PackingConfig, tokenizer: Tokenizer, images: pa.Table, split: str
) -> list[tuple[int, list[int]]]:
    """(image_id, token ids) of one image document per image of `split`, in a seeded order."""
    rows = [r for r in images.select(["image_id", "split", "caption", "questions", "answers"]).to_pylist()
            if r["split"] == split]
    if not rows:
        raise ValueError(f"the image table has no {split!r} rows; raise n_images")
    r = make_rng(cfg.seed, "pack-image-docs", split)
    texts = []
    for row in rows:
        if r.random() < cfg.caption_fraction:
            texts.append(" " + row["caption"])
        else:
            texts.append("".join(q + a for q, a in map(qa_text, row["questions"], row["answers"])))
    block, eos = image_block(tokenizer, cfg.image_tokens), tokenizer.token_to_id(EOS)
    docs = [(row["image_id"], block + ids + [eos]) for row, ids in zip(rows, encode_batch(tokenizer, texts))]
    return [docs[int(i)] for i in r.permutation(len(docs))]


def _text_stream(tokenizer: Tokenizer, corpus: pa.Table, seed: int) -> np.ndarray:
    """The train split's documents in a seeded order, each followed by <|eos|>, as one int32 array."""
    texts = split_texts(corpus, "train")
    order = make_rng(seed, "pack-text-order").permutation(len(texts))
    eos = tokenizer.token_to_id(EOS)
    encoded = encode_batch(tokenizer, (texts[int(i)] for i in order))
    total = sum(len(e) + 1 for e in encoded)
    return np.fromiter((t for e in encoded for t in (*e, eos)), dtype=np.int32, count=total)


def pack_pretraining(
    cfg: PackingConfig,
    clues: CluesConfig,
    seq_len: int,
    n_sequences: int,
    *,
    tokenizer: Tokenizer,
    corpus: pa.Table,
    images: pa.Table,
) -> pa.Table:
    """`n_sequences` rows of exactly `seq_len` tokens mixing text, clue and image rows (module docstring)."""
    if seq_len < 2 or n_sequences < 1:
        raise ValueError(f"need seq_len >= 2 and n_sequences >= 1, got {seq_len}, {n_sequences}")
    # Separate streams keep row i independent of n_sequences: packing more rows extends the table.
    kinds = [
        ROW_KINDS[int(k)]
        for k in make_rng(cfg.seed, "pack-kinds", seq_len).choice(
            3,
            size=n_sequences,
            p=[1 - cfg.clue_fraction - cfg.image_fraction, cfg.clue_fraction, cfg.image_fraction],
        )
    ]
    pad, image_id_token = tokenizer.token_to_id(PAD), tokenizer.token_to_id(IMAGE)

    stream = _text_stream(tokenizer, corpus, cfg.seed)
    cursor = int(make_rng(cfg.seed, "pack-text-start", seq_len).integers(len(stream)))
    n_clue = kinds.count("clue")
    clue_examples = iter(
        clue_training_examples(
            clues, seq_len, n_clue, tokenizer=tokenizer, filler=build_filler(corpus, tokenizer, "train")
        )
        if n_clue
        else []
    )
    image_docs = _image_documents(cfg, tokenizer, images, "train") if "image" in kinds else []
    if image_docs and min(len(d) for _, d in image_docs) > seq_len:
        raise ValueError(
            f"seq_len={seq_len} cannot hold one image document ({min(len(d) for _, d in image_docs)} "
            "tokens); set image_fraction=0 for this stage or lower image_tokens"
        )
    # Documents waiting to be packed, in the seeded order, cycling through the train images.
    pending = image_docs[:_IMAGE_LOOKAHEAD]
    next_image = len(pending)

    input_ids, image_ids, answer_start, answer_end, distance = [], [], [], [], []
    epochs_of_text = 0
    for kind in kinds:
        used_images: list[int] = []
        a0 = a1 = dist = -1
        if kind == "text":
            idx = (cursor + np.arange(seq_len)) % len(stream)
            row = stream[idx]
            epochs_of_text += int(cursor + seq_len >= len(stream))
            cursor = (cursor + seq_len) % len(stream)
        elif kind == "clue":
            ex = next(clue_examples)
            row, a0, a1, dist = ex.input_ids, ex.answer_start, ex.answer_end, ex.distance
        else:
            parts, filled = [], 0
            while True:
                # The first of the next few pending documents that fits; none fitting ends the row.
                fits = [j for j in range(min(_IMAGE_LOOKAHEAD, len(pending)))
                        if filled + len(pending[j][1]) <= seq_len]
                if not fits:
                    break
                image_id, doc = pending[fits[0]]
                del pending[fits[0]]
                pending.append(image_docs[next_image % len(image_docs)])
                next_image += 1
                parts.append(doc)
                used_images.append(image_id)
                filled += len(doc)
            parts.append([pad] * (seq_len - filled))
            row = np.array([t for p in parts for t in p], dtype=np.int32)
        input_ids.append(np.asarray(row, dtype=np.int32))
        image_ids.append(used_images)
        answer_start.append(a0)
        answer_end.append(a1)
        distance.append(dist)

    ids_NT = np.stack(input_ids)
    loss_mask_NT = ((ids_NT != pad) & (ids_NT != image_id_token)).astype(np.uint8)
    table = pa.table(
        {
            "input_ids": pa.array(list(ids_NT), pa.list_(pa.int32())),
            "loss_mask": pa.array(list(loss_mask_NT), pa.list_(pa.uint8())),
            "kind": pa.array(kinds, pa.string()),
            "image_ids": pa.array(image_ids, pa.list_(pa.int32())),
            "answer_start": pa.array(answer_start, pa.int32()),
            "answer_end": pa.array(answer_end, pa.int32()),
            "distance": pa.array(distance, pa.int32()),
        }
    )
    return with_metadata(
        table,
        {
            "generator": "pack_pretraining",
            "config": asdict(cfg),
            "clues": asdict(clues),
            "seq_len": seq_len,
            "n_sequences": n_sequences,
            "text_stream_tokens": int(len(stream)),
            "text_wraps": epochs_of_text,
        },
    )


def vqa_eval_set(
    cfg: PackingConfig, *, tokenizer: Tokenizer, images: pa.Table, split: str = "heldout"
) -> pa.Table:
    """One row per (held-out image, question): image_id, question, prompt_ids (<|bos|>, the image
    block, the question up to "Answer:"), answer_ids, answer. No caption, so the answer must come from
    the image."""
    bos = tokenizer.token_to_id(BOS)
    block = image_block(tokenizer, cfg.image_tokens)
    rows = images.select(["image_id", "split", "questions", "answers"]).to_pylist()
    out = {"image_id": [], "question": [], "prompt_ids": [], "answer_ids": [], "answer": []}
    for row in rows:
        if row["split"] != split:
            continue
        for q, a in zip(row["questions"], row["answers"]):
            prompt, answer = qa_text(q, a)
            out["image_id"].append(row["image_id"])
            out["question"].append(q)
            out["prompt_ids"].append([bos] + block + encode(tokenizer, prompt))
            out["answer_ids"].append(encode(tokenizer, answer))
            out["answer"].append(a)
    table = pa.table(
        {
            "image_id": pa.array(out["image_id"], pa.int32()),
            "question": pa.array(out["question"], pa.string()),
            "prompt_ids": pa.array(out["prompt_ids"], pa.list_(pa.int32())),
            "answer_ids": pa.array(out["answer_ids"], pa.list_(pa.int32())),
            "answer": pa.array(out["answer"], pa.string()),
        }
    )
    return with_metadata(table, {"generator": "vqa_eval_set", "config": asdict(cfg), "split": split})
