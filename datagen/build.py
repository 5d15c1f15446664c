"""Build every data artifact of a profile into one directory (the command line's and benchmarks' path).

The Dagster assets call the generators one by one; this runs the same calls in lineage order
(corpus → tokenizer → images → clue eval grid → VQA eval set → one packed pretraining table per
context stage), writes each with `datagen.io`, and returns a manifest of file names, sha256, row
counts and seconds taken. Only the timings vary between two runs of the same config.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from datagen.clues import clue_eval_grid
from datagen.corpus import build_corpus
from datagen.images import build_images
from datagen.io import write_parquet, write_text
from datagen.packing import pack_pretraining, vqa_eval_set
from datagen.profiles import DatagenConfig
from datagen.tokenizer import tokenizer_to_json, train_tokenizer


# The files `k3model.train.pretrain_data.PretrainData` reads: the pretraining loop packs its own rows.
PRETRAIN_INPUTS = ("corpus.parquet", "tokenizer.json", "images.parquet", "clue_eval.parquet")


def build_all(cfg: DatagenConfig, out_dir: str | Path, *, pretrain_inputs_only: bool = False) -> dict:
    """Every artifact of `cfg`, or with `pretrain_inputs_only` the first four (PRETRAIN_INPUTS): no VQA
    eval set and no packed stage tables (small's four are 2^24 tokens each)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"profile": cfg.profile, "config": cfg.to_dict(), "files": {}}

    def record(name: str, sha: str, rows: int, t0: float) -> None:
        seconds = round(time.perf_counter() - t0, 3)
        manifest["files"][name] = {"sha256": sha, "rows": rows, "seconds": seconds}

    t0 = time.perf_counter()
    corpus = build_corpus(cfg.corpus)
    record("corpus.parquet", write_parquet(corpus, out / "corpus.parquet"), corpus.num_rows, t0)

    t0 = time.perf_counter()
    tok = train_tokenizer(cfg.tokenizer, corpus)
    record("tokenizer.json", write_text(tokenizer_to_json(tok), out / "tokenizer.json"),
           tok.get_vocab_size(), t0)

    t0 = time.perf_counter()
    images = build_images(cfg.images)
    record("images.parquet", write_parquet(images, out / "images.parquet"), images.num_rows, t0)

    t0 = time.perf_counter()
    grid = clue_eval_grid(cfg.clues, tokenizer=tok, corpus=corpus)
    record("clue_eval.parquet", write_parquet(grid, out / "clue_eval.parquet"), grid.num_rows, t0)
    if pretrain_inputs_only:
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        return manifest

    t0 = time.perf_counter()
    vqa = vqa_eval_set(cfg.packing, tokenizer=tok, images=images)
    record("vqa_eval.parquet", write_parquet(vqa, out / "vqa_eval.parquet"), vqa.num_rows, t0)

    for stage, (length, n) in enumerate(zip(cfg.context_lengths, cfg.sequences_per_stage()), start=1):
        t0 = time.perf_counter()
        table = pack_pretraining(cfg.packing, cfg.clues, length, n, tokenizer=tok, corpus=corpus,
                                 images=images)
        name = f"pretrain_stage{stage}_{length}.parquet"
        record(name, write_parquet(table, out / name), table.num_rows, t0)

    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
