"""Pretraining batches from the data assets: tokenizer, corpus, images and the clue configuration.

A stage's rows are packed once by `datagen.packing.pack_pretraining` (text windows, scattered-clue
examples of exactly the stage length, image documents whose <|image|> slots the vision
encoder fills), then batch `step` is rows [step·B, (step+1)·B): a pure function of
(seed, stage, step), which is what makes a resumed run end where an uninterrupted one would.
Legend: B batch rows, T tokens, N images, H/W pixels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from datagen.clues import CluesConfig
from datagen.images import images_array
from datagen.io import read_parquet, sha256_file
from datagen.packing import PackingConfig, pack_pretraining
from datagen.tokenizer import IMAGE, load_tokenizer
from k3model.config import ModelConfig
from k3model.model import IGNORE_INDEX

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainData:
    """Where the data assets are. `clues` must be the config the clue eval grid was built with."""
    tokenizer_path: Path
    corpus_path: Path
    images_path: Path
    clue_eval_path: Path
    clues: CluesConfig = field(default_factory=CluesConfig)

    def __post_init__(self) -> None:
        for name in ("tokenizer_path", "corpus_path", "images_path", "clue_eval_path"):
            path = Path(getattr(self, name))
            if not path.exists():
                raise ValueError(f"PretrainData.{name}: {path} does not exist; materialize its asset first")

    def versions(self) -> dict[str, str]:
        """Content hashes of every input: the data versions recorded in each checkpoint."""
        return {name: sha256_file(getattr(self, name))
                for name in ("tokenizer_path", "corpus_path", "images_path", "clue_eval_path")}

    @cached_property
    def tokenizer(self):
        return load_tokenizer(self.tokenizer_path)

    @cached_property
    def corpus(self):
        return read_parquet(self.corpus_path)

    @cached_property
    def images(self):
        return read_parquet(self.images_path)

    @cached_property
    def clue_eval(self):
        return read_parquet(self.clue_eval_path)

    @cached_property
    def image_pixels_NHWC(self) -> np.ndarray:
        ids = self.images.column("image_id").to_numpy()
        if not np.array_equal(ids, np.arange(len(ids))):
            raise ValueError("the image table's image_id column must be 0 … N−1 in order")
        return images_array(self.images)


def pixels_to_tensor(pixels_NHWC: np.ndarray, device: str = "cpu") -> torch.Tensor:
    """uint8 HWC images → float NCHW, roughly zero-mean unit-scale."""
    x = torch.from_numpy(np.ascontiguousarray(pixels_NHWC)).to(device).float()
    return ((x / 255.0 - 0.5) / 0.25).permute(0, 3, 1, 2).contiguous()


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] int64
    labels: torch.Tensor  # [B, T], IGNORE_INDEX where nothing is predicted
    images: torch.Tensor | None  # [N, C, H, W] in slot order, or None
    image_mask: torch.Tensor | None  # [B, T] True on <|image|> slots
    # [B, T] True where labels[t] is a clue answer's token (or its <|eos|>); None: no separate mean.
    answer_mask: torch.Tensor | None = None


CLUE_LOSSES = ("answer", "all")


class StageBatches:
    """The packed rows of one stage, served as deterministic batches.

    `clue_loss`: "answer" trains a clue row on its answer and <|eos|> only and gives those targets
    their own mean in the loss (`Batch.answer_mask`, `K3Model.compute_loss`); "all" trains every
    token of every row with one mean. With "all" the tiny model does not learn the clue task: the
    filler and the clue statements (random names and values, unpredictable) outweigh the ~10 answer
    targets of a row ~50 : 1 (docs/log/tiny.md).
    """

    def __init__(self, data: PretrainData, model_cfg: ModelConfig, *, seq_len: int, batch_size: int,
                 seed: int, stage: int, clue_fraction: float, image_fraction: float, device: str = "cpu",
                 clue_loss: str = "answer", clue_warmup_rows: int = 0):
        if clue_loss not in CLUE_LOSSES:
            raise ValueError(f"clue_loss must be one of {CLUE_LOSSES}, got {clue_loss!r}")
        self.clue_loss = clue_loss
        if model_cfg.vision is None:
            image_fraction, image_tokens = 0.0, 1
        else:
            image_tokens = model_cfg.vision.tokens_per_image
        if data.tokenizer.get_vocab_size() > model_cfg.vocab_size:
            raise ValueError(f"the tokenizer has {data.tokenizer.get_vocab_size()} tokens but the model's "
                             f"vocab_size is {model_cfg.vocab_size}: train the tokenizer with vocab_size ≤ "
                             f"{model_cfg.vocab_size} or enlarge the model")
        # An image document must fit in a row: drop images from stages too short to hold one.
        if image_tokens + 16 > seq_len and image_fraction > 0:
            logger.info("stage %d: rows of %d tokens cannot hold an image document (%d image tokens); "
                        "training this stage on text and clue rows only", stage, seq_len, image_tokens)
            image_fraction = 0.0
        self.batch_size, self.device, self.data = batch_size, device, data
        self.image_token = data.tokenizer.token_to_id(IMAGE)
        self._packing = PackingConfig(seed=seed * 100 + stage, image_tokens=image_tokens,
                                      clue_fraction=clue_fraction, image_fraction=image_fraction)
        # The first `clue_warmup_rows` rows are clue rows only, packed from their own seed stream.
        self._warmup = (PackingConfig(seed=seed * 100 + stage + 50, image_tokens=image_tokens, clue_fraction=1.0,
                                      image_fraction=0.0), clue_warmup_rows)
        self.seq_len = seq_len
        self._rows = None

    def pack(self, n_rows: int) -> None:
        """Pack the first `n_rows` rows; the training loop calls it once for the whole stage."""
        def packed(cfg: PackingConfig, n: int) -> pa.Table:
            return pack_pretraining(cfg, self.data.clues, self.seq_len, n, tokenizer=self.data.tokenizer,
                                    corpus=self.data.corpus, images=self.data.images)
        warm_cfg, n_warm = self._warmup
        n_warm = min(n_warm, n_rows)
        parts = ([packed(warm_cfg, n_warm)] if n_warm else []) + ([packed(self._packing, n_rows - n_warm)]
                                                                 if n_rows > n_warm else [])
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        loss_mask = np.stack(table.column("loss_mask").to_numpy(zero_copy_only=False)).astype(bool)
        # answer_NT[r, t]: token t of row r is a clue answer's token or the <|eos|> after it.
        t = np.arange(self.seq_len)
        a0 = table.column("answer_start").to_numpy()[:, None]
        a1 = table.column("answer_end").to_numpy()[:, None]
        answer_NT = (a0 >= 0) & (t >= a0) & (t <= a1)
        if self.clue_loss == "answer":
            loss_mask &= answer_NT | (a0 < 0)
        self._rows = {
            "input_ids": np.stack(table.column("input_ids").to_numpy(zero_copy_only=False)).astype(np.int64),
            "loss_mask": loss_mask,
            "answer": answer_NT,
            "image_ids": table.column("image_ids").to_pylist(),
            "kind": table.column("kind").to_pylist(),
        }

    def batch(self, step: int) -> Batch:
        lo, hi = step * self.batch_size, (step + 1) * self.batch_size
        if self._rows is None or len(self._rows["kind"]) < hi:
            raise ValueError(f"batch {step} is beyond the packed rows; call pack(n_rows ≥ {hi}) first")
        ids_BT = torch.from_numpy(self._rows["input_ids"][lo:hi]).to(self.device)
        mask_BT = torch.from_numpy(self._rows["loss_mask"][lo:hi]).to(self.device)
        labels = torch.full_like(ids_BT, IGNORE_INDEX)
        labels[:, :-1] = ids_BT[:, 1:].masked_fill(~mask_BT[:, 1:], IGNORE_INDEX)
        answer_BT = None
        if self.clue_loss == "answer":
            # labels[t] is token t + 1: the answer targets are read one position early.
            answer_BT = torch.zeros_like(mask_BT)
            answer_BT[:, :-1] = torch.from_numpy(self._rows["answer"][lo:hi, 1:]).to(self.device)
        image_ids = [i for row in self._rows["image_ids"][lo:hi] for i in row]
        if not image_ids:
            return Batch(ids_BT, labels, None, None, answer_BT)
        images = pixels_to_tensor(self.data.image_pixels_NHWC[image_ids], self.device)
        return Batch(ids_BT, labels, images, ids_BT == self.image_token, answer_BT)
