"""Pretraining: native multimodal next-token training over four context stages (DESIGN.md §1, §4).

One call trains one stage:  setup → model → optimizer → data → loop (eval/checkpoint, step, log).

- Loss: next-token CE on text, clue and image-caption rows (image tokens come from the vision
  encoder, trained from scratch with the LM), plus λ·MTP; LatentMoE biases are updated after each
  optimizer step (quantile balancing by default).
- Stages: lengths in the ratio 1 : 8 : 32 : 128 (8K : 64K : 256K : 1M in K3); each stage starts
  from the previous stage's weights with no positional change — the model has no positional encoding.
- Per-Head Muon (AdamW for embeddings, norms, gates; `optimizer: adamw` for AdamW throughout), each
  MLA head's max attention logit logged every step (QK-Clip with `qk_clip_tau`), linear warmup +
  cosine decay (`schedule.stage_lr_at`: after a clue warmup, optionally a second
  warmup and cosine at `StageConfig.mixed_lr`), gradient clipping, bf16 autocast on CUDA
  (the optimizer, autocast, clipped step, balancing, resume and metric buffer are
  `k3model.train.common`'s).
- Checkpoints every `ckpt_every` steps under `out_dir/last` with the full train state; a killed run
  called again with the same arguments resumes there and ends where an uninterrupted run would
  (batches are a pure function of (seed, stage, step), RNG and optimizer state are restored).
- Step metrics stay on the device until a log or checkpoint step reads them all at once.

No Dagster, Ray or MLflow here: the caller passes `log_fn(step, metrics)` to see progress.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

import math

from k3model.config import ModelConfig, get_profile
from k3model.limits import check_fits_machine
from k3model.moe import BALANCING_MODES
from k3model.model import K3Model
from k3model.train.pretrain_data import Batch, PretrainData, StageBatches
from k3model.train.pretrain_eval import evaluate
from k3model.schedule import stage_lr_at
from k3model.train.common import (OPTIMIZERS, Loop, LoopConfig, MetricBuffer, attention_logits, autocast_for,
                                  balance_experts, build_optimizer, load_weights, optimizer_step, restore_train_state,
                                  save_state, set_lr, tail_mean, track_max_logits)
from k3model.train.expert_load import load_stats

LogFn = Callable[[int, dict], None]


# (clue pairs per cell, perplexity windows, VQA questions) per profile: the smoke profile only has to
# exercise the code in CI; tiny has to decide claim 1, so it scores every pair of its grid (None),
# which datagen/profiles.py sizes for that (96–384 pairs per distance bucket).
EVAL_SIZES: dict[str, tuple[int | None, int, int]] = {"smoke": (1, 2, 8), "tiny": (None, 8, 64),
                                                      "small": (16, 32, 256)}


# Claim 2's balancing ablation beside stage 1 (`balancing_arms`): optimizer steps per arm. tiny's 100
# steps of 32 × 64 tokens keep both arms inside ≈ 2 minutes of `make run` on 2 cores (issue 43).
BALANCING_ARM_STEPS: dict[str, int] = {"smoke": 3, "tiny": 100, "small": 200}
UNBALANCED = "none"


@dataclass(frozen=True)
class PretrainConfig(LoopConfig):
    """LoopConfig with steps and lr taken from the profile's stage (None) and a 10 % warmup, and
    pretraining's own fields."""
    # None: take the profile's value for this stage.
    steps: int | None = None
    lr: float | None = None
    warmup_frac: float = 0.1
    profile: str = "tiny"
    stage: int = 1  # 1 … 4
    batch_size: int | None = None
    seq_len: int | None = None
    clue_fraction: float = 0.5  # rows of each batch that are scattered-clue examples
    # "answer": clue rows train on their answers only, with their own mean; "all": every token, one
    # mean (pretrain_data.StageBatches).
    clue_loss: str = "answer"
    clue_warmup_steps: int | None = None  # None: the profile's (StageConfig.clue_warmup_steps)
    # Peak lr after the clue warmup (StageConfig.mixed_lr); None: the profile's, 0: one schedule.
    mixed_lr: float | None = None
    image_fraction: float = 0.25  # rows that start with an image and its caption
    # End-of-stage evaluation sizes; None takes the profile's (EVAL_SIZES).
    eval_examples_per_cell: int | None = None  # (scattered, control) pairs per (length, distance) cell
    eval_max_length: int | None = None  # longest clue-eval length to score; None: every length
    eval_ppl_windows: int | None = None
    eval_vqa_questions: int | None = None
    balancing: str | None = None  # override the profile's MoE balancing ("quantile" | "deepseek" | "none")
    quantile_window_tokens: int | None = None  # override the stage's (StageConfig) MoEConfig.quantile_window_tokens
    # "muon": Per-Head Muon on the hidden matrices, AdamW on the rest (k3model/train/muon.py); or "adamw";
    # None: the profile's (`Profile.optimizer`, the winner of that profile's A/B).
    optimizer: str | None = None
    # QK-Clip threshold τ on each MLA head's max attention logit (K2 uses 100); None: monitored, not clipped.
    qk_clip_tau: float | None = None
    # CUDA only: k3model.compiled.compile_regions on the model before the first step (the step
    # benchmarks/model/train_step.py --compile-regions times; off by default until the loop has run it on a GPU).
    compile_regions: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        get_profile(self.profile)  # raises ValueError naming the valid profiles
        if not 1 <= self.stage <= 4:
            raise ValueError(f"stage must be 1, 2, 3 or 4, got {self.stage}")
        for name in ("batch_size", "seq_len", "eval_examples_per_cell", "eval_ppl_windows", "eval_vqa_questions"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        if self.clue_warmup_steps is not None and self.clue_warmup_steps < 0:
            raise ValueError(f"clue_warmup_steps must be ≥ 0, got {self.clue_warmup_steps}")
        for name in ("clue_fraction", "image_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.clue_loss not in ("answer", "all"):
            raise ValueError(f"clue_loss must be 'answer' or 'all', got {self.clue_loss!r}")
        if self.clue_fraction + self.image_fraction > 1.0:
            raise ValueError("clue_fraction + image_fraction must not exceed 1")
        if self.mixed_lr is not None and self.mixed_lr < 0:
            raise ValueError(f"mixed_lr must be ≥ 0, got {self.mixed_lr}")
        if self.qk_clip_tau is not None and self.qk_clip_tau <= 0:
            raise ValueError(f"qk_clip_tau must be > 0 (K2 uses 100) or None for no clip, got {self.qk_clip_tau}")
        if self.balancing is not None and self.balancing not in BALANCING_MODES:
            raise ValueError(f"balancing must be one of {BALANCING_MODES} (or None for the profile's), "
                             f"got {self.balancing!r}")
        if self.quantile_window_tokens is not None and self.quantile_window_tokens < 0:
            raise ValueError(f"quantile_window_tokens must be ≥ 0 (0: K3's overwrite), got {self.quantile_window_tokens}")
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS} (or None for the profile's), got {self.optimizer!r}")

    def resolved(self) -> "ResolvedStage":
        profile = get_profile(self.profile)
        stage = profile.stages[self.stage - 1]
        model = profile.model if self.balancing is None else replace(profile.model, balancing=self.balancing)
        window = stage.quantile_window_tokens if self.quantile_window_tokens is None else self.quantile_window_tokens
        if window is not None:
            model = replace(model, quantile_window_tokens=window)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        notes = ()
        if stage.activation_checkpointing is not None:
            ckpt = stage.activation_checkpointing
            if not ckpt and stage.checkpointing_off_gib is not None and device == "cuda":
                gib = torch.cuda.get_device_properties(0).total_memory / 2**30
                if gib < stage.checkpointing_off_gib:
                    ckpt = True
                    notes = (f"activation checkpointing kept on: stage {self.stage} needs ~{stage.checkpointing_off_gib:g} "
                             f"GiB without it, this GPU has {gib:.0f} GiB",)
            model = replace(model, activation_checkpointing=ckpt)
        resolved = ResolvedStage(
            model=model,
            steps=self.steps or stage.steps,
            batch_size=self.batch_size or stage.batch_size,
            seq_len=self.seq_len or stage.seq_len,
            lr=self.lr or stage.lr,
            clue_warmup_steps=stage.clue_warmup_steps if self.clue_warmup_steps is None else self.clue_warmup_steps,
            mixed_lr=stage.mixed_lr if self.mixed_lr is None else (self.mixed_lr or None),
            device=device, optimizer=self.optimizer or profile.optimizer, notes=notes,
        )
        check_fits_machine(model, resolved.steps, resolved.batch_size, resolved.seq_len, resolved.device)
        if self.compile_regions and resolved.device != "cuda":
            raise ValueError("compile_regions compiles for CUDA (Inductor's Triton kernels) and this machine has "
                             "no GPU: leave compile_regions false")
        return resolved


def balancing_arms(profile: str, *, seed: int = 0, steps: int | None = None, balanced: str | None = None,
                   log_every: int = 10) -> dict[str, PretrainConfig]:
    """Claim 2's ablation: two short stage-1 runs that differ only in MoE balancing, `{balanced: cfg,
    "none": cfg}` — same data, seed, model and schedule, `steps` each (None: BALANCING_ARM_STEPS).
    Both train mixed rows from the first step with one warmup + cosine (no clue warmup: a short arm
    would otherwise see clue rows only, unlike the held-out mixed set its load is measured on), and
    evaluate at stage 1's length only. `balanced` (None: the profile's balancing) must balance."""
    profile_cfg = get_profile(profile)
    balanced = profile_cfg.model.balancing if balanced is None else balanced
    if balanced not in BALANCING_MODES or balanced == UNBALANCED:
        raise ValueError(f"the balanced arm needs a balancing that balances, one of "
                         f"{tuple(m for m in BALANCING_MODES if m != UNBALANCED)}, got {balanced!r}"
                         + (" (the profile's own)" if balanced == profile_cfg.model.balancing else ""))
    stage_1 = profile_cfg.stages[0]
    steps = BALANCING_ARM_STEPS.get(profile, stage_1.steps) if steps is None else steps
    if not 1 <= steps <= stage_1.steps:
        raise ValueError(f"balancing arm steps must lie in [1, {stage_1.steps}] (stage 1's length at {profile}: "
                         f"the arms are a short run beside it), got {steps}")
    common = dict(profile=profile, stage=1, seed=seed, steps=steps, clue_warmup_steps=0, mixed_lr=0,
                  ckpt_every=steps, log_every=log_every, eval_max_length=stage_1.seq_len,
                  eval_examples_per_cell=1, eval_ppl_windows=2, eval_vqa_questions=8)
    return {arm: PretrainConfig(balancing=arm, **common) for arm in (balanced, UNBALANCED)}


@dataclass(frozen=True)
class ResolvedStage:
    model: ModelConfig
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    clue_warmup_steps: int
    mixed_lr: float | None
    device: str
    optimizer: str = "muon"
    notes: tuple[str, ...] = ()  # what was decided for this machine, logged at the stage's start


@dataclass
class PretrainResult:
    checkpoint_dir: Path
    history: list[dict] = field(default_factory=list)
    eval: dict[str, float] = field(default_factory=dict)
    tokens_seen: int = 0
    resumed_from_step: int | None = None


def eval_sizes(profile: str) -> tuple[int | None, int, int]:
    """(clue pairs per cell — None: every pair of the grid —, perplexity windows, VQA questions) for
    end-of-stage evaluation."""
    return EVAL_SIZES.get(profile, EVAL_SIZES["tiny"])


def step_metrics(model: K3Model, optimizer: torch.optim.Optimizer, batch: Batch, grad_clip: float,
                 device: str, qk_clip_tau: float | None = None) -> dict[str, torch.Tensor]:
    """One optimizer step, the MoE bias update and (with `qk_clip_tau`) QK-Clip; its metrics as 0-d
    tensors (no host sync), with each MLA head's max attention logit when the model records them."""
    model.train()
    with autocast_for(device):
        losses = model.compute_loss(batch.input_ids, batch.labels, batch.images, batch.image_mask,
                                    answer_mask_BT=batch.answer_mask)
    grad_norm = optimizer_step(model, optimizer, losses["loss/total"], grad_clip)
    balance = balance_experts(model)
    balance.update(attention_logits(model, qk_clip_tau))
    metrics = {f"train/{k.split('/', 1)[1]}": v.detach() for k, v in losses.items()}
    metrics["train/grad_norm"] = grad_norm
    metrics.update(balance)
    return metrics


def train_step(model: K3Model, optimizer: torch.optim.Optimizer, batch: Batch, grad_clip: float,
               device: str) -> dict[str, float]:
    """`step_metrics` read to the host: one step's metrics as floats."""
    return MetricBuffer.read(step_metrics(model, optimizer, batch, grad_clip, device))


def train(cfg: PretrainConfig, data: PretrainData, out_dir: str | Path,
          init_checkpoint: str | Path | None = None, log_fn: LogFn | None = None,
          stop_after: int | None = None) -> PretrainResult:
    """Train one stage. `stop_after` ends the loop early after that many steps (used to test resume)."""
    # ---- setup
    stage = cfg.resolved()
    device = stage.device
    loop = Loop(cfg, out_dir, log_fn, steps=stage.steps, seed=cfg.seed * 1000 + cfg.stage, stop_after=stop_after)
    for note in stage.notes:
        warnings.warn(note, stacklevel=1)

    # ---- model
    model = K3Model(stage.model)
    # A damaged `last/` is set aside with a warning and the stage starts from its beginning (common.resume).
    run = loop.resume(model)
    if run.state is None and init_checkpoint is not None:
        load_weights(model, init_checkpoint)
    model.to(device)
    track_max_logits(model)
    if cfg.compile_regions:
        from k3model.compiled import compile_regions

        compile_regions(model, dynamic=True)

    # ---- optimizer
    optimizer = build_optimizer(model, stage.lr, cfg.weight_decay, optimizer=stage.optimizer)
    if run.state is not None:
        restore_train_state(run.state, optimizer)

    # ---- data
    batches = StageBatches(data, stage.model, seq_len=stage.seq_len, batch_size=stage.batch_size,
                           seed=cfg.seed, stage=cfg.stage, clue_fraction=cfg.clue_fraction,
                           image_fraction=cfg.image_fraction, device=device, clue_loss=cfg.clue_loss,
                           clue_warmup_rows=min(stage.clue_warmup_steps, stage.steps) * stage.batch_size)
    batches.pack(stage.steps * stage.batch_size)
    manifest_extra = {"config": {"pretrain": asdict(cfg), "model": asdict(stage.model),
                                 "resolved": {k: v for k, v in asdict(stage).items() if k != "model"}},
                      "data_versions": data.versions()}

    # Claim 2's training-time figure: expert loads summed over the steps that hold the stage's last
    # 10 % of tokens (every step has batch_size × seq_len), kept in the train state across a resume.
    tail_from = int(0.9 * stage.steps)
    saved_tail = run.state.extra.get("tail_loads") if run.state is not None else None
    tail = {"loads": None if saved_tail is None else torch.tensor(saved_tail, dtype=torch.float64, device=device)}

    def save(step: int, path: Path, with_state: bool, metrics: dict | None = None) -> None:
        save_state(path, model, dict(manifest_extra, metrics=metrics or {}),
                   optimizer if with_state else None, step,
                   {"history": run.history, "tokens_seen": run.tokens_seen,
                    "tail_loads": None if tail["loads"] is None else tail["loads"].tolist()})

    # ---- loop
    warmup = cfg.warmup_steps(stage.steps)
    started = time.perf_counter()
    for step in loop.steps():
        lr = stage_lr_at(step, stage.steps, stage.lr, warmup, cfg.min_lr_ratio,
                         switch_step=stage.clue_warmup_steps, second_peak_lr=stage.mixed_lr)
        set_lr(optimizer, lr)
        batch = batches.batch(step)
        metrics = step_metrics(model, optimizer, batch, cfg.grad_clip, device, cfg.qk_clip_tau)
        if step >= tail_from and model.moe_layers():
            loads_NE = torch.stack([m.last_load.to(device, torch.float64) for m in model.moe_layers()])
            tail["loads"] = loads_NE if tail["loads"] is None else tail["loads"] + loads_NE
        n_tokens = batch.input_ids.numel()
        run.tokens_seen += n_tokens
        metrics.update({"train/lr": lr, "step": step + 1})
        loop.end_step(step, metrics, save, tokens=n_tokens, check=lambda rows: _fail_if_diverged(rows, cfg.stage, stage.lr))
    if loop.stopped:
        return PretrainResult(loop.last_dir, run.history, {}, run.tokens_seen, run.from_step)

    # ---- final evaluation and checkpoint
    pairs, windows, questions = eval_sizes(cfg.profile)
    eval_metrics = evaluate(model, data, stage.model, device=device, seed=cfg.seed,
                            examples_per_cell=cfg.eval_examples_per_cell or pairs,
                            max_length=cfg.eval_max_length, ppl_windows=cfg.eval_ppl_windows or windows,
                            vqa_questions=cfg.eval_vqa_questions or questions)
    eval_metrics["perf/tokens_per_s"] = loop.buffer.tokens / max(loop.buffer.seconds, 1e-9)
    eval_metrics["perf/wall_s"] = time.perf_counter() - started
    eval_metrics["train/tokens_seen"] = float(run.tokens_seen)
    if run.history:
        eval_metrics["train/final_loss"] = tail_mean(run.history, "train/main")
        eval_metrics["train/first_loss"] = run.history[0]["train/main"]
        if "moe/load_max_over_mean" in run.history[-1]:
            eval_metrics["moe/load_max_over_mean"] = tail_mean(run.history, "moe/load_max_over_mean")
    if tail["loads"] is not None:
        tail_stats = load_stats(tail["loads"].cpu(), stage.model.top_k)
        eval_metrics["moe/train_tail_load_max_over_mean"] = tail_stats["load_max_over_mean"]
        eval_metrics["moe/train_tail_load_max_over_mean_worst"] = tail_stats["load_max_over_mean_worst"]
        eval_metrics["moe/train_tail_dead_fraction"] = tail_stats["dead_fraction"]
        eval_metrics["moe/train_tail_tokens"] = float((stage.steps - tail_from) * stage.batch_size * stage.seq_len)
    loop.log(stage.steps, eval_metrics)
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        raise FloatingPointError(f"stage {cfg.stage} diverged: its final weights are not finite (peak lr "
                                 f"{stage.lr:g}); lower lr")
    save(stage.steps, loop.final_dir, with_state=False, metrics=eval_metrics)
    return PretrainResult(loop.final_dir, run.history, eval_metrics, run.tokens_seen, run.from_step)


def _fail_if_diverged(rows: list[dict], stage: int, peak_lr: float) -> None:
    """Fail the stage rather than go on from (and checkpoint) NaN weights. Runs on each flushed window
    of metrics, before it is logged or a checkpoint is written, so no step synchronises for it."""
    for row in rows:
        for key in ("train/total", "train/grad_norm"):
            if not math.isfinite(row[key]):
                raise FloatingPointError(
                    f"stage {stage} diverged: {key} is {row[key]} at step {row['step']} (peak lr "
                    f"{peak_lr:g}); nothing from this step on is kept: lower lr or raise warmup_frac")
