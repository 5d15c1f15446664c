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
