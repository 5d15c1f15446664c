"""Pretraining: native multimodal next-token training over four context stages (DESIGN.md §1, §4).

One call trains one stage:  setup → model → optimizer → data → loop (eval/checkpoint, step, log).

- Loss: next-token CE on text, clue and image-caption rows (image tokens come from the vision
  encoder, trained from scratch with the LM), plus λ·MTP; LatentMoE biases are updated after each
  optimizer step (quantile balancing by default).
- Stages: lengths in the ratio 1 : 8 : 32 : 128 (8K : 64K : 256K : 1M in K3); each stage starts
  from the previous stage's weights with no positional change — the model has no positional encoding.
- AdamW, linear warmup + cosine decay (`schedule.lr_at`), gradient clipping, bf16 autocast on CUDA.
- Checkpoints every `ckpt_every` steps under `out_dir/last` with the full train state; a killed run
  called again with the same arguments resumes there and ends where an uninterrupted run would
  (batches are a pure function of (seed, stage, step), RNG and optimizer state are restored).

No Dagster, Ray or MLflow here: the caller passes `log_fn(step, metrics)` to see progress.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

import torch

from k3model.checkpoint import (TrainState, capture_rng_state, load_checkpoint, load_resume_state,
                                restore_rng_state, save_checkpoint)
from k3model.config import ModelConfig, VisionConfig, get_profile
from k3model.limits import check_fits_machine
from k3model.model import K3Model
from k3model.pretrain_data import Batch, PretrainData, StageBatches
from k3model.pretrain_eval import evaluate
from k3model.schedule import lr_at

LogFn = Callable[[int, dict], None]


# (clue pairs per cell, perplexity windows, VQA questions) per profile: the smoke profile only has to
# exercise the code in CI; tiny has to say something about claim 1.
EVAL_SIZES = {"smoke": (1, 2, 8), "tiny": (3, 8, 64), "small": (16, 32, 256)}


@dataclass(frozen=True)
class PretrainConfig:
    profile: str = "tiny"
    stage: int = 1  # 1 … 4
    seed: int = 0
    # None: take the profile's value for this stage.
    steps: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    lr: float | None = None
    warmup_frac: float = 0.1
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    clue_fraction: float = 0.5  # rows of each batch that are scattered-clue examples
    image_fraction: float = 0.25  # rows that start with an image and its caption
    ckpt_every: int = 0  # 0: four times per stage
    log_every: int = 10
    # End-of-stage evaluation sizes; None takes the profile's (EVAL_SIZES).
    eval_examples_per_cell: int | None = None  # (scattered, control) pairs per (length, distance) cell
    eval_max_length: int | None = None  # longest clue-eval length to score; None: every length
    eval_ppl_windows: int | None = None
    eval_vqa_questions: int | None = None
    balancing: str | None = None  # override the profile's MoE balancing ("quantile" | "deepseek" | "none")

    def __post_init__(self) -> None:
        get_profile(self.profile)  # raises ValueError naming the valid profiles
        if not 1 <= self.stage <= 4:
            raise ValueError(f"stage must be 1, 2, 3 or 4, got {self.stage}")
        for name in ("steps", "batch_size", "seq_len", "eval_examples_per_cell", "eval_ppl_windows",
                     "eval_vqa_questions"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        for name in ("clue_fraction", "image_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.clue_fraction + self.image_fraction > 1.0:
            raise ValueError("clue_fraction + image_fraction must not exceed 1")
        # `lr: .inf` used to train a stage to NaN weights and materialize them.
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value}")
        for name in ("lr", "grad_clip"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("warmup_frac", "min_lr_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be ≥ 0, got {self.weight_decay}")

    def resolved(self) -> "ResolvedStage":
        profile = get_profile(self.profile)
        stage = profile.stages[self.stage - 1]
        model = profile.model if self.balancing is None else replace(profile.model, balancing=self.balancing)
        resolved = ResolvedStage(
            model=model,
            steps=self.steps or stage.steps,
            batch_size=self.batch_size or stage.batch_size,
            seq_len=self.seq_len or stage.seq_len,
            lr=self.lr or stage.lr,
            device="cuda" if torch.cuda.is_available() else "cpu",
        )
        check_fits_machine(model, resolved.steps, resolved.batch_size, resolved.seq_len, resolved.device)
        return resolved


@dataclass(frozen=True)
class ResolvedStage:
    model: ModelConfig
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    device: str


@dataclass
class PretrainResult:
    checkpoint_dir: Path
    history: list[dict] = field(default_factory=list)
    eval: dict[str, float] = field(default_factory=dict)
    tokens_seen: int = 0
    resumed_from_step: int | None = None


def eval_sizes(profile: str) -> tuple[int, int, int]:
    """(clue pairs per cell, perplexity windows, VQA questions) for end-of-stage evaluation."""
    return EVAL_SIZES.get(profile, EVAL_SIZES["tiny"])


def load_pretrained(checkpoint_dir: str | Path, device: str = "cpu") -> tuple[K3Model, dict]:
    """The model a checkpoint holds (hashes verified), built from the config its manifest records."""
    weights, manifest = load_checkpoint(checkpoint_dir)
    recorded = dict(manifest["config"]["model"])
    if recorded.get("vision") is not None:
        recorded["vision"] = VisionConfig(**recorded["vision"])
    model = K3Model(ModelConfig(**recorded))
    model.load_state_dict(weights)
    return model.to(device), manifest


def build_optimizer(model: K3Model, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW; no decay on norms, biases, pseudo-queries and gate scalars (1-D parameters)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def _autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def train_step(model: K3Model, optimizer: torch.optim.Optimizer, batch: Batch, grad_clip: float,
               device: str) -> dict[str, float]:
    model.train()
    with _autocast(device):
        losses = model.compute_loss(batch.input_ids, batch.labels, batch.images, batch.image_mask)
    optimizer.zero_grad(set_to_none=True)
    losses["loss/total"].backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    loads = []
    for moe in model.moe_layers():
        loads.append(moe.load_max_over_mean())
        moe.update_bias()
    metrics = {f"train/{k.split('/', 1)[1]}": float(v.detach()) for k, v in losses.items()}
    metrics["train/grad_norm"] = float(grad_norm)
    if loads:
        metrics["moe/load_max_over_mean"] = sum(loads) / len(loads)
        metrics["moe/load_max_over_mean_worst"] = max(loads)
    return metrics


def train(cfg: PretrainConfig, data: PretrainData, out_dir: str | Path,
          init_checkpoint: str | Path | None = None, log_fn: LogFn | None = None,
          stop_after: int | None = None) -> PretrainResult:
    """Train one stage. `stop_after` ends the loop early after that many steps (used to test resume)."""
    # ---- setup
    out_dir = Path(out_dir)
    stage = cfg.resolved()
    device = stage.device
    torch.manual_seed(cfg.seed * 1000 + cfg.stage)
    ckpt_every = cfg.ckpt_every or max(stage.steps // 4, 1)
    last_dir = out_dir / "last"
    log = log_fn or (lambda step, metrics: None)

    # ---- model
    model = K3Model(stage.model)
    start_step, history, tokens_seen, resumed = 0, [], 0, None
    # A damaged `last/` is set aside with a warning, and the stage starts from its beginning.
    resume = load_resume_state(last_dir)
    train_state = resume[1] if resume is not None else None
    if resume is not None:
        model.load_state_dict(resume[0])
        start_step, resumed = train_state.step, train_state.step
        history, tokens_seen = train_state.extra["history"], train_state.extra["tokens_seen"]
        log(start_step, {"event/resumed_from_step": start_step})
    elif init_checkpoint is not None:
        weights, _ = load_checkpoint(init_checkpoint)
        model.load_state_dict(weights)
    model.to(device)

    # ---- optimizer
    optimizer = build_optimizer(model, stage.lr, cfg.weight_decay)
    if train_state is not None:
        optimizer.load_state_dict(train_state.optimizer)
        restore_rng_state(train_state.rng)

    # ---- data
    batches = StageBatches(data, stage.model, seq_len=stage.seq_len, batch_size=stage.batch_size,
                           seed=cfg.seed, stage=cfg.stage, clue_fraction=cfg.clue_fraction,
                           image_fraction=cfg.image_fraction, device=device)
    batches.pack(stage.steps * stage.batch_size)
    manifest_extra = {"config": {"pretrain": asdict(cfg), "model": asdict(stage.model),
                                 "resolved": {k: v for k, v in asdict(stage).items() if k != "model"}},
                      "data_versions": data.versions()}

    def save(step: int, path: Path, with_state: bool, metrics: dict | None = None) -> None:
        state = None
        if with_state:
            state = TrainState(step=step, optimizer=optimizer.state_dict(), rng=capture_rng_state(),
                               extra={"history": history, "tokens_seen": tokens_seen})
        extra = dict(manifest_extra, metrics=metrics or {})
        save_checkpoint(path, {k: v.detach().cpu() for k, v in model.state_dict().items()}, extra,
                        train_state=state, overwrite=True)

    # ---- loop
    warmup = max(int(cfg.warmup_frac * stage.steps), 1)
    started = time.perf_counter()
    timed_tokens, timed_seconds = 0, 0.0
    for step in range(start_step, stage.steps):
        if stop_after is not None and step >= start_step + stop_after:
            return PretrainResult(last_dir, history, {}, tokens_seen, resumed)
        lr = lr_at(step, stage.steps, stage.lr, warmup, cfg.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = batches.batch(step)
        t0 = time.perf_counter()
        metrics = train_step(model, optimizer, batch, cfg.grad_clip, device)
        dt = time.perf_counter() - t0
        # Fail the stage rather than go on from (and checkpoint) NaN weights.
        for key in ("train/total", "train/grad_norm"):
            if not math.isfinite(metrics[key]):
                raise FloatingPointError(
                    f"stage {cfg.stage} diverged: {key} is {metrics[key]} at step {step + 1} (peak lr "
                    f"{stage.lr:g}); nothing from this step on is kept: lower lr or raise warmup_frac")
        n_tokens = batch.input_ids.numel()
        tokens_seen += n_tokens
        timed_tokens, timed_seconds = timed_tokens + n_tokens, timed_seconds + dt
        metrics.update({"train/lr": lr, "perf/tokens_per_s": n_tokens / dt, "step": step + 1})
        history.append(metrics)
        if (step + 1) % cfg.log_every == 0 or step + 1 == stage.steps:
            log(step + 1, metrics)
        if (step + 1) % ckpt_every == 0 and step + 1 < stage.steps:
            save(step + 1, last_dir, with_state=True)

    # ---- final evaluation and checkpoint
    pairs, windows, questions = eval_sizes(cfg.profile)
    eval_metrics = evaluate(model, data, stage.model, device=device, seed=cfg.seed,
                            examples_per_cell=cfg.eval_examples_per_cell or pairs,
                            max_length=cfg.eval_max_length, ppl_windows=cfg.eval_ppl_windows or windows,
                            vqa_questions=cfg.eval_vqa_questions or questions)
    eval_metrics["perf/tokens_per_s"] = timed_tokens / max(timed_seconds, 1e-9)
    eval_metrics["perf/wall_s"] = time.perf_counter() - started
    eval_metrics["train/tokens_seen"] = float(tokens_seen)
    if history:
        eval_metrics["train/final_loss"] = _tail_mean(history, "train/main")
        eval_metrics["train/first_loss"] = history[0]["train/main"]
        if "moe/load_max_over_mean" in history[-1]:
            eval_metrics["moe/load_max_over_mean"] = _tail_mean(history, "moe/load_max_over_mean")
    log(stage.steps, eval_metrics)
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        raise FloatingPointError(f"stage {cfg.stage} diverged: its final weights are not finite (peak lr "
                                 f"{stage.lr:g}); lower lr")
    final_dir = out_dir / "final"
    save(stage.steps, final_dir, with_state=False, metrics=eval_metrics)
    return PretrainResult(final_dir, history, eval_metrics, tokens_seen, resumed)


def _tail_mean(history: list[dict], key: str, frac: float = 0.1) -> float:
    """Mean of `key` over the last `frac` of the history (at least one step): a less noisy endpoint."""
    n = max(math.ceil(len(history) * frac), 1)
    values = [h[key] for h in history[-n:] if key in h]
    return sum(values) / len(values)
