"""Deterministic data generators for the K3 recipe: same config → same bytes.

    cfg = datagen.presets("tiny")                       # DatagenConfig: one sub-config per generator
    corpus = datagen.build_corpus(cfg.corpus)           # stdlib code + docstrings + generated prose
    tok = datagen.train_tokenizer(cfg.tokenizer, corpus)
    images = datagen.build_images(cfg.images)
    grid = datagen.clue_eval_grid(cfg.clues, tokenizer=tok, corpus=corpus)
    stage1 = datagen.pack_pretraining(cfg.packing, cfg.clues, 128, 4096,
                                      tokenizer=tok, corpus=corpus, images=images)
    datagen.io.write_parquet(stage1, "stage1.parquet")  # returns the file's sha256

Modules: `tokenizer` (byte-level BPE, special tokens), `corpus` (+ `prose`), `clues` (scattered-clue
training sequences, eval grid, checker), `images` (numpy-rendered scenes with captions and questions),
`packing` (fixed-length pretraining rows, VQA eval set), `sft` (expert demonstrations at three
reasoning efforts, token ids and loss masks), `profiles` (presets), `io` (deterministic
Parquet and hashing), `build` (everything for a profile; also `python -m datagen`).

Names are resolved on first use, so `import datagen` costs nothing until a generator is needed.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "presets": "datagen.profiles",
    "DatagenConfig": "datagen.profiles",
    "PROFILES": "datagen.profiles",
    "TokenizerConfig": "datagen.tokenizer",
    "SPECIAL_TOKENS": "datagen.tokenizer",
    "train_tokenizer": "datagen.tokenizer",
    "load_tokenizer": "datagen.tokenizer",
    "special_token_ids": "datagen.tokenizer",
    "CorpusConfig": "datagen.corpus",
    "build_corpus": "datagen.corpus",
    "CluesConfig": "datagen.clues",
    "build_filler": "datagen.clues",
    "clue_training_set": "datagen.clues",
    "clue_eval_set": "datagen.clues",
    "clue_eval_grid": "datagen.clues",
    "distance_buckets": "datagen.clues",
    "eval_cells": "datagen.clues",
    "solve": "datagen.clues",
    "ImagesConfig": "datagen.images",
    "build_images": "datagen.images",
    "decode_image": "datagen.images",
    "images_array": "datagen.images",
    "image_token_count": "datagen.images",
    "PackingConfig": "datagen.packing",
    "pack_pretraining": "datagen.packing",
    "vqa_eval_set": "datagen.packing",
    "build_all": "datagen.build",
    "SFTDataConfig": "datagen.sft",
    "build_sft": "datagen.sft",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    # Submodules (datagen.io, datagen.clues, ...) are importable as attributes too.
    try:
        return importlib.import_module(f"datagen.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"datagen.{name}":
            raise
        raise AttributeError(f"module 'datagen' has no attribute {name!r}") from None
