"""Data assets: corpus → tokenizer → clue_data, and image_data (docs/design.md §1), over `datagen`.

`build(profile)` makes the four assets of one profile (keys `<profile>/corpus`, …, in the group
`<profile>_data`). Each asset builds its table with the profile's preset
(`datagen.presets(profile, seed)`), writes one file into the store under a directory named by the
file's sha256, and reports the path, rows, hash, a preview of the first rows and an MLflow run. The sha256 is the asset's data version: the
generators are deterministic, so rebuilding unchanged data gives the same version and leaves the
pretraining assets fresh.
"""

import dataclasses
import time
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from assets.config_bounds import AssetConfig
from assets.display import inline_png, markdown_table, thumbnail
from assets.lineage import group, key, profile_tags, require_upstream, require_upstreams, tag_run
from assets.storage import publish as _publish
from k3model.checkpoint import source_tree_sha256

# Bumps whenever the generators' source changes, so the UI marks data built by older code as stale.
DATAGEN_CODE_VERSION = source_tree_sha256(packages=("datagen",))[:12]
RESOURCES = {"store", "mlflow"}


class DataConfig(AssetConfig):
    seed: int = Field(default=0, ge=0, description="seeds the generator (same seed → same bytes)")


def _result(context: dg.AssetExecutionContext, profile: str, path: Path, sha: str, rows: int,
            seconds: float, config: dict[str, Any], preview: list[dict[str, Any]],
            extra_metadata: dict[str, Any] | None = None, artifacts: list[Path] = ()) -> dg.MaterializeResult:
    """Log the MLflow run and build the MaterializeResult every data asset returns."""
    mlflow = context.resources.mlflow
    nbytes = path.stat().st_size
    with mlflow.start_run(context, params={"profile": profile, **_flat(config)},
                          tags=profile_tags(profile)) as run:
        mlflow.log_metrics(run.info.run_id, {"data/rows": rows, "data/bytes": nbytes, "perf/wall_s": seconds})
        for artifact in artifacts:
            mlflow.client().log_artifact(run.info.run_id, str(artifact))
    metadata = {
        "path": dg.MetadataValue.path(str(path)),
        "dagster/row_count": rows,
        "sha256": sha,
        "bytes": nbytes,
        "perf/wall_s": round(seconds, 3),
        "profile": profile,
        "config": dg.MetadataValue.json(config),
        "preview": dg.MetadataValue.md(markdown_table(preview)),
        "mlflow_run": dg.MetadataValue.url(mlflow.run_url(run)),
        **(extra_metadata or {}),
    }
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(sha),
                                tags=profile_tags(profile))


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def materialize_corpus(context: dg.AssetExecutionContext, config: DataConfig, profile: str) -> dg.MaterializeResult:
    from datagen import presets
    from datagen.corpus import build_corpus
    from datagen.io import write_parquet

    tag_run(context, profile)
    cfg = presets(profile, config.seed).corpus
    t0 = time.perf_counter()
    table = build_corpus(cfg)
    path, sha = _publish(context.resources.store.data_dir(profile, "corpus"), "corpus.parquet",
                         lambda p: write_parquet(table, p))
    seconds = time.perf_counter() - t0
    splits = table.column("split").to_pylist()
    preview = table.select(["doc_id", "source", "split", "text"]).slice(0, 5).to_pylist()
    return _result(context, profile, path, sha, table.num_rows, seconds, dataclasses.asdict(cfg), preview,
                   {"heldout_rows": splits.count("heldout"),
                    "chars": sum(len(t) for t in table.column("text").to_pylist())})


def materialize_tokenizer(context: dg.AssetExecutionContext, profile: str) -> dg.MaterializeResult:
    from datagen import presets
    from datagen.io import read_parquet, write_text
    from datagen.tokenizer import decode, encode, tokenizer_to_json, train_tokenizer

    tag_run(context, profile)
    corpus_path = require_upstream(context, "corpus", profile).path
    cfg = presets(profile).tokenizer
    t0 = time.perf_counter()
    tok = train_tokenizer(cfg, read_parquet(corpus_path))
    path, sha = _publish(context.resources.store.data_dir(profile, "tokenizer"), "tokenizer.json",
                         lambda p: write_text(tokenizer_to_json(tok), p))
    seconds = time.perf_counter() - t0
    samples = ["def forward(self, x):", "The digit 7 in green.", "X7 = 42. What is X7?"]
    preview = [{"text": s, "ids": encode(tok, s), "round_trip": decode(tok, encode(tok, s)) == s}
               for s in samples]
    return _result(context, profile, path, sha, tok.get_vocab_size(), seconds, dataclasses.asdict(cfg),
                   preview, {"vocab_size": tok.get_vocab_size()})


def materialize_clue_data(context: dg.AssetExecutionContext, config: DataConfig, profile: str) -> dg.MaterializeResult:
    from datagen import presets
    from datagen.clues import clue_eval_grid
    from datagen.io import read_parquet, write_parquet
    from datagen.tokenizer import load_tokenizer

    tag_run(context, profile)
    ups = require_upstreams(context, ["corpus", "tokenizer"], profile)
    tok = load_tokenizer(ups["tokenizer"].path)
    corpus_table = read_parquet(ups["corpus"].path)
    cfg = presets(profile, config.seed).clues
    t0 = time.perf_counter()
    table = clue_eval_grid(cfg, tokenizer=tok, corpus=corpus_table)
    path, sha = _publish(context.resources.store.data_dir(profile, "clue_data"), "clue_eval.parquet",
                         lambda p: write_parquet(table, p))
    seconds = time.perf_counter() - t0
    cells: dict[str, int] = {}
    for length, lo, hi in zip(table.column("length_target").to_pylist(), table.column("bucket_lo").to_pylist(),
                              table.column("bucket_hi").to_pylist()):
        cell = f"len {length} / dist [{lo}, {hi})"
        cells[cell] = cells.get(cell, 0) + 1
    preview = table.select(["length_target", "variant", "kind", "n_clues", "distance", "answer"]) \
        .slice(0, 6).to_pylist()
    return _result(context, profile, path, sha, table.num_rows, seconds, dataclasses.asdict(cfg), preview,
                   {"cells": dg.MetadataValue.json(cells), "num_cells": len(cells)})


def materialize_image_data(context: dg.AssetExecutionContext, config: DataConfig, profile: str) -> dg.MaterializeResult:
    from datagen import presets
    from datagen.images import build_images, images_array
    from datagen.io import write_parquet
    from PIL import Image

    tag_run(context, profile)
    cfg = presets(profile, config.seed).images
    t0 = time.perf_counter()
    table = build_images(cfg)

    def grid(n: int, columns: int):
        # The first images side by side, for a glance at what the vision encoder learns from.
        from PIL import Image
        pixels = images_array(table.slice(0, n))
        n, h, w, _ = pixels.shape
        sheet = Image.new("RGB", (columns * w, ((n + columns - 1) // columns) * h))
        for i in range(n):
            sheet.paste(Image.fromarray(pixels[i]), ((i % columns) * w, (i // columns) * h))
        return sheet

    def contact_sheet(directory: Path) -> None:
        sheet = grid(16, 4)
        sheet.resize((sheet.width * 4, sheet.height * 4), Image.NEAREST).save(directory / "preview.png")

    path, sha = _publish(context.resources.store.data_dir(profile, "image_data"), "images.parquet",
                         lambda p: write_parquet(table, p), extra=contact_sheet)
    seconds = time.perf_counter() - t0
    splits = table.column("split").to_pylist()
    preview = table.select(["image_id", "split", "kind", "caption", "questions", "answers"]).slice(0, 5).to_pylist()
    sheet = path.parent / "preview.png"
    return _result(context, profile, path, sha, table.num_rows, seconds, dataclasses.asdict(cfg), preview,
                   {"heldout_rows": splits.count("heldout"), "image_size": cfg.image_size,
                    "first_images": thumbnail(grid(4, 4), f"the first 4 images ({profile})",
                                              "the first 4 images (all 16 in preview_png)"),
                    "preview_png": inline_png(sheet, f"the first 16 images ({profile})")}, artifacts=[sheet])


def build(profile: str) -> list[dg.AssetsDefinition]:
    """The data assets of `profile`: `<profile>/corpus`, `tokenizer`, `clue_data`, `image_data`."""
    common = dict(key_prefix=[profile], group_name=group(profile, "data"), code_version=DATAGEN_CODE_VERSION,
                  required_resource_keys=RESOURCES, tags=profile_tags(profile))

    @dg.asset(name="corpus", kinds={"python", "parquet"}, **common,
              description="Text and code documents (standard-library code and docstrings, generated "
                          "prose), with a held-out split.")
    def corpus(context: dg.AssetExecutionContext, config: DataConfig) -> dg.MaterializeResult:
        return materialize_corpus(context, config, profile)

    @dg.asset(name="tokenizer", kinds={"python", "json"}, deps=[key(profile, "corpus")], **common,
              description="Byte-level BPE trained on the corpus's train split, with the chat, tool, image "
                          "and effort special tokens.")
    def tokenizer(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        return materialize_tokenizer(context, profile)

    @dg.asset(name="clue_data", kinds={"python", "parquet"}, deps=[key(profile, "tokenizer"), key(profile, "corpus")],
              **common,
              description="Scattered-clue eval grid: for each context length and clue-distance bucket, "
                          "held-out examples (clues far apart, distractors, one question needing every "
                          "clue), each with its control twin. Training examples are packed per stage from "
                          "the same config at training time.")
    def clue_data(context: dg.AssetExecutionContext, config: DataConfig) -> dg.MaterializeResult:
        return materialize_clue_data(context, config, profile)

    @dg.asset(name="image_data", kinds={"python", "parquet"}, **common,
              description="Synthetic images (shapes on a grid, digits) with captions and question/answer pairs.")
    def image_data(context: dg.AssetExecutionContext, config: DataConfig) -> dg.MaterializeResult:
        return materialize_image_data(context, config, profile)

    return [corpus, tokenizer, clue_data, image_data]



def data_config_json(path: Path) -> dict[str, Any]:
    """The generator config recorded in a data file's Parquet metadata."""
    import pyarrow.parquet as pq
    from datagen.io import table_metadata
    return table_metadata(pq.read_schema(path)).get("config", {})
