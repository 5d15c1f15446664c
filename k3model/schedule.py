"""Learning-rate schedule: linear warmup, then cosine decay to a floor (pure functions, tested)."""

from __future__ import annotations

import math


def lr_at(step: int, total_steps: int, peak_lr: float, warmup_steps: int, min_lr_ratio: float = 0.1) -> float:
    """The learning rate for optimizer step `step` (0-based) of `total_steps`."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be ≥ 1, got {total_steps}")
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    floor = peak_lr * min_lr_ratio
    return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def stage_lr_at(step: int, total_steps: int, peak_lr: float, warmup_steps: int, min_lr_ratio: float = 0.1,
                switch_step: int = 0, second_peak_lr: float | None = None) -> float:
    """`lr_at` over the whole stage, or, with `second_peak_lr`, two schedules: `lr_at` as usual for
    steps before `switch_step`, then from `switch_step` a fresh warmup (the same fraction of the steps
    left as `warmup_steps` is of the stage) and cosine to `second_peak_lr · min_lr_ratio`."""
    if second_peak_lr is None or not 0 < switch_step < total_steps or step < switch_step:
        return lr_at(step, total_steps, peak_lr, warmup_steps, min_lr_ratio)
    left = total_steps - switch_step
    second_warmup = max(round(warmup_steps * left / total_steps), 1)
    return lr_at(step - switch_step, left, second_peak_lr, second_warmup, min_lr_ratio)
