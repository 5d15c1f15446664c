"""Supervised fine-tuning on expert demonstrations at three reasoning efforts, QAT on (DESIGN.md §1, §4).

One call trains the SFT cold start:  setup → model → optimizer → data → loop (checkpoint, step, log).

- Data: `datagen.sft` rows (token ids produced once by the project's tokenizer, never re-tokenized,
  and a loss mask that is 1 on the model's own tokens: scratchpads, calls, `<|end|>`). The target
  of position t is token t+1 where that token is the model's own, else ignored:

      labels[t] = input_ids[t+1]  if loss_mask[t+1]  else IGNORE
      loss      = mean over labelled positions of CE(logits[t], labels[t])   (+ λ·MTP, as pretraining)

  so the mean runs over own tokens of the whole batch (token-level, not per-row). Batch `step`
  holds rows of a per-epoch permutation seeded by (seed, epoch), rows of similar length together
  (`Demonstrations.rows`), right-padded to the batch's longest row with `<|pad|>` (never a
  target): a pure function of (seed, step), which is what lets a killed run resume exactly.
- QAT from the first step: `k3model.train.qat.prepare_qat` before the optimizer exists — MXFP4
  weights and MXFP8 activations on the routed experts through `kernels.mx.fake_quant_mx`,
  straight-through.
- AdamW, warmup + cosine (`schedule.lr_at`), clipping, bf16 autocast on CUDA, MoE bias updates after
  each step, resume from `out_dir/last`, metrics read to the host only at log and checkpoint steps:
  all `k3model.train.common`'s.
- Initial weights: a base-model checkpoint (its manifest's model config is used), or with none a
  freshly initialized model of the profile (logged: it is only for tests and ablations).

No Dagster, Ray or MLflow here: the caller passes `log_fn(step, metrics)` to see progress.
Legend: B rows per batch, T tokens (the batch's longest row), N rows of the data set.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import torch

from datagen.io import read_parquet, sha256_file, table_metadata
from datagen.sft import FORMAT
from k3model.checkpoint import load_model
from k3model.config import ModelConfig, get_profile
from k3model.model import IGNORE_INDEX, K3Model
from k3model.train.common import (Loop, LoopConfig, autocast_for, balance_experts, build_optimizer, optimizer_step,
                                  restore_train_state, save_state, set_lr, tail_mean)
from k3model.train.qat import check_scope, frozen_expert_weights, prepare_qat, qat_scheme

logger = logging.getLogger(__name__)

LogFn = Callable[[int, dict], None]
PAD_ID = 0  # datagen.tokenizer.PAD: special tokens take ids 0… in SPECIAL_TOKENS order
BUCKET_WINDOW = 8  # batches per length-sorted window (Demonstrations.rows)


@dataclass(frozen=True)
class SFTConfig(LoopConfig):
    """LoopConfig's defaults (200 steps at 1e-3, 5 % warmup, cosine to 0.1×) and SFT's own fields."""
    profile: str = "tiny"  # the model shape when training from scratch; a base checkpoint's own wins
    batch_size: int = 8
    qat: bool = True  # MXFP4 weights / MXFP8 activations on the routed experts from the first step
    qat_scale_rounding: str = "ceil"  # kernels.mx's E8M0 scale rounding: "ceil" (RCEIL) or "floor" (OCP)
    qat_scope: str = "experts"  # k3model.train.qat.QUANT_SCOPES: K3's routed experts, or "all_linear" too

    def __post_init__(self) -> None:
        super().__post_init__()
        get_profile(self.profile)  # raises ValueError naming the valid profiles
        if self.profile == "k3":
            raise ValueError("profile 'k3' is never instantiated: choose smoke, tiny or small")
        self.require_positive("steps", "batch_size")
        check_scope(self.qat_scope)


@dataclass
class SFTResult:
    checkpoint_dir: Path
    history: list[dict] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    tokens_seen: int = 0  # labelled (own) tokens trained on
    resumed_from_step: int | None = None


class Demonstrations:
    """The rows of a `datagen.sft` table as tensors, and the batches of a run."""

    def __init__(self, table: pa.Table, vocab_size: int):
        meta = table_metadata(table)
        if meta.get("format") != FORMAT:
            raise ValueError(f"the demonstrations table has format {meta.get('format')!r}, not {FORMAT!r}: "
                             "build it with datagen.sft.build_sft")
        if table.num_rows == 0:
            raise ValueError("the demonstrations table has no rows: raise SFTDataConfig.max_tokens or add families")
        self.efforts = table.column("effort").to_pylist()
        self.domains = table.column("domain").to_pylist()
        self.harnesses = table.column("harness").to_pylist()
        self.ids = [torch.tensor(x, dtype=torch.long) for x in table.column("input_ids").to_pylist()]
        self.own = [torch.tensor(x, dtype=torch.bool) for x in table.column("loss_mask").to_pylist()]
        self._epochs: dict[tuple[int, int, int], list[list[int]]] = {}
        top = max(int(x.max()) for x in self.ids)
        if top >= vocab_size:
            raise ValueError(f"the demonstrations hold token id {top} but the model's vocabulary has "
                             f"{vocab_size} ids: build them with the tokenizer the model was trained with")

    def __len__(self) -> int:
        return len(self.ids)

    def rows(self, seed: int, step: int, batch_size: int) -> list[int]:
        """The row indices of batch `step`. Each epoch is a permutation seeded by (seed, epoch), cut
        into windows of `BUCKET_WINDOW` batches whose rows are sorted by length before they are split
        into batches, and the epoch's batches are then shuffled: rows of similar length share a batch,
        so little of it is padding (the demonstrations run from ~300 to ~1,200 tokens). The rows left
        over by the last full batch sit out that epoch. With batch_size ≥ N, batch `step` holds
        positions step·B … step·B + B−1 of consecutive epochs' permutations."""
        n = len(self)
        if batch_size >= n:
            return [self._perm(seed, p // n)[p % n] for p in range(step * batch_size, (step + 1) * batch_size)]
        per_epoch = n // batch_size
        epoch, k = divmod(step, per_epoch)
        key = (seed, epoch, batch_size)
        if key not in self._epochs:
            perm = self._perm(seed, epoch)
            window = batch_size * BUCKET_WINDOW
            batches = []
            for at in range(0, per_epoch * batch_size, window):
                chunk = sorted(perm[at: min(at + window, per_epoch * batch_size)], key=lambda r: len(self.ids[r]))
                batches += [chunk[b: b + batch_size] for b in range(0, len(chunk), batch_size)]
            gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 7)
            self._epochs = {key: [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]}
        return self._epochs[key][k]

    def _perm(self, seed: int, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        return torch.randperm(len(self), generator=gen).tolist()

    def batch(self, rows: list[int], device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids_BT, labels_BT), right-padded; labels are the next token where it is the model's own."""
        T = max(len(self.ids[r]) for r in rows)
        ids_BT = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
        labels_BT = torch.full((len(rows), T), IGNORE_INDEX, dtype=torch.long)
        for b, r in enumerate(rows):
            ids, own = self.ids[r], self.own[r]
            ids_BT[b, : len(ids)] = ids
            labels_BT[b, : len(ids) - 1] = torch.where(own[1:], ids[1:], IGNORE_INDEX)
        return ids_BT.to(device), labels_BT.to(device)


def _read_demos(demos: pa.Table | str | Path) -> tuple[pa.Table, dict[str, str]]:
    if isinstance(demos, pa.Table):
        return demos, {}
    path = Path(demos)
    if not path.exists():
        raise ValueError(f"no SFT demonstrations at {path}: build them first (datagen.sft.build_sft)")
    return read_parquet(path), {"sft_demos": sha256_file(path)}


def _initial_model(cfg: SFTConfig, init_checkpoint: str | Path | None) -> tuple[K3Model, dict]:
    if init_checkpoint is None:
        logger.warning("SFT starts from a freshly initialized %s model (no base checkpoint given)", cfg.profile)
        return K3Model(get_profile(cfg.profile).model), {}
    model, manifest = load_model(init_checkpoint, qat=False)  # SFT turns QAT on itself (cfg.qat)
    return model, {"base_model": manifest["sha256"]}


@torch.no_grad()
def demo_loss(model: K3Model, demos: Demonstrations, batch_size: int = 8, device: str | torch.device = "cpu",
              prefix: str = "eval") -> dict[str, float]:
    """Mean next-token CE on own tokens: over all rows (`<prefix>/loss`), per effort
    (`<prefix>/loss/<effort>`), per (domain, effort) and per harness (`<prefix>/loss/harness/<h>`).
    With the same keys, two competence floors per row, averaged over rows:
    `<prefix>/p_demo…` = exp(−Σ own-token NLL), the probability that a temperature-1 sample writes the
    demonstration's turns exactly, and `<prefix>/greedy_match…` = 1 when the argmax is the
    demonstration's token at every own position, i.e. greedy decoding replays the demonstration. Both
    replay a verified expert episode (the env's observations follow from the same actions), so each is
    a lower bound of the policy's success on that task at that temperature."""
    model.eval()
    sums: dict[str, list[float]] = {}

    def add(key: str, value: float, n: int) -> None:
        acc = sums.setdefault(key, [0.0, 0])
        acc[0] += value
        acc[1] += n

    # The weights stay fixed through the pass: QAT quantizes each expert stack once.
    with frozen_expert_weights(model):
        for start in range(0, len(demos), batch_size):
            rows = list(range(start, min(start + batch_size, len(demos))))
            ids_BT, labels_BT = demos.batch(rows, device)
            logits_BTV = model(ids_BT).logits_BTV.float()
            nll_BT = torch.nn.functional.cross_entropy(logits_BTV.transpose(1, 2), labels_BT,
                                                       ignore_index=IGNORE_INDEX, reduction="none")
            match_BT = logits_BTV.argmax(-1) == labels_BT
            for b, r in enumerate(rows):
                own = labels_BT[b] != IGNORE_INDEX
                nll, n = float(nll_BT[b][own].sum()), int(own.sum())
                replayed = float(bool(match_BT[b][own].all()))
                for key in ("", f"/{demos.efforts[r]}", f"/{demos.domains[r]}/{demos.efforts[r]}",
                            f"/harness/{demos.harnesses[r]}"):
                    add(f"{prefix}/loss{key}", nll, n)
                    add(f"{prefix}/p_demo{key}", math.exp(-nll), 1)
                    add(f"{prefix}/greedy_match{key}", replayed, 1)
    return {key: total / n for key, (total, n) in sorted(sums.items()) if n}


def train(cfg: SFTConfig, demos: pa.Table | str | Path, out_dir: str | Path,
          init_checkpoint: str | Path | None = None, eval_demos: pa.Table | str | Path | None = None,
          log_fn: LogFn | None = None, stop_after: int | None = None) -> SFTResult:
    """Fine-tune on `demos` (a `datagen.sft` table or its Parquet file). At the end the own-token
    loss is measured on `demos` (`fit/loss…`) and, when given, on held-out `eval_demos` (`eval/loss…`,
    e.g. other task seeds). `stop_after` ends the loop early after that many steps (to test resume)."""
    # ---- setup
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loop = Loop(cfg, out_dir, log_fn, stop_after=stop_after)

    # ---- model (QAT before the optimizer: the first step already trains through the quantizer)
    model, data_versions = _initial_model(cfg, init_checkpoint)
    if cfg.qat:
        prepare_qat(model, cfg.qat_scale_rounding, cfg.qat_scope)
    run = loop.resume(model)
    model.to(device)

    # ---- optimizer
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    if run.state is not None:
        restore_train_state(run.state, optimizer)

    # ---- data
    table, demo_versions = _read_demos(demos)
    data = Demonstrations(table, model.cfg.vocab_size)
    model_cfg: ModelConfig = model.cfg
    manifest_extra = {"config": {"sft": asdict(cfg), "model": asdict(model_cfg),
                                 "qat": qat_scheme(cfg.qat_scope) if cfg.qat else None, "data": table_metadata(table)},
                      "data_versions": {**data_versions, **demo_versions}}

    def save(step: int, path: Path, with_state: bool, metrics: dict | None = None) -> None:
        save_state(path, model, dict(manifest_extra, metrics=metrics or {}),
                   optimizer if with_state else None, step,
                   {"history": run.history, "tokens_seen": run.tokens_seen})

    # ---- loop
    for step in loop.steps():
        lr = cfg.lr_at(step)
        set_lr(optimizer, lr)
        ids_BT, labels_BT = data.batch(data.rows(cfg.seed, step, cfg.batch_size), device)
        model.train()
        with autocast_for(device):
            losses = model.compute_loss(ids_BT, labels_BT)
        grad_norm = optimizer_step(model, optimizer, losses["loss/total"], cfg.grad_clip)
        n_own = int((labels_BT != IGNORE_INDEX).sum())
        run.tokens_seen += n_own
        metrics = {f"train/{k.split('/', 1)[1]}": v.detach() for k, v in losses.items()}
        metrics.update(balance_experts(model))
        metrics.update({"train/grad_norm": grad_norm, "train/lr": lr, "train/own_tokens": n_own, "step": step + 1})
        loop.end_step(step, metrics, save, tokens=n_own)
    if loop.stopped:
        return SFTResult(loop.last_dir, run.history, {}, run.tokens_seen, run.from_step)

    # ---- final metrics and checkpoint
    metrics = demo_loss(model, data, cfg.batch_size, device, prefix="fit")
    if eval_demos is not None:
        eval_table, eval_versions = _read_demos(eval_demos)
        metrics.update(demo_loss(model, Demonstrations(eval_table, model_cfg.vocab_size), cfg.batch_size, device))
        manifest_extra["data_versions"].update({f"eval_{k}": v for k, v in eval_versions.items()})
    metrics["perf/own_tokens_per_s"] = loop.buffer.tokens / max(loop.buffer.seconds, 1e-9)
    metrics["train/tokens_seen"] = float(run.tokens_seen)
    if run.history:
        metrics["train/first_loss"] = run.history[0]["train/main"]
        metrics["train/final_loss"] = tail_mean(run.history, "train/main")
    loop.log(cfg.steps, metrics)
    save(cfg.steps, loop.final_dir, with_state=False, metrics=metrics)
    return SFTResult(loop.final_dir, run.history, metrics, run.tokens_seen, run.from_step)
