"""Tensor-in, tensor-out generation for a batch of equal-length prompts: a thin wrapper of
k3model/engine.py (the one decode loop), for callers that hold an [B, T] id tensor.

Greedy when temperature == 0, else sampling from softmax(logits / temperature), optionally top-k;
rows that stop at eos_id early are padded with eos_id. For per-row lengths, log-probabilities and
top-p, call `k3model.engine.generate` directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k3model.engine import SamplingConfig
from k3model.engine import generate as engine_generate
from k3model.model import K3Model


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int | None = None
    eos_id: int | None = None

    def __post_init__(self) -> None:
        self.sampling()  # SamplingConfig's ValueErrors for bad values

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.max_new_tokens, self.temperature, self.top_k,
                              stop_ids=() if self.eos_id is None else (self.eos_id,))


def generate(model: K3Model, input_ids_BT: torch.Tensor, cfg: GenerationConfig = GenerationConfig(),
             images_NCHW=None, image_mask_BT=None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Returns the new tokens [B, ≤ max_new_tokens]; rows that hit eos are padded with eos."""
    images = None
    if images_NCHW is not None:
        if input_ids_BT.shape[0] != 1:
            raise ValueError("images with a batch of prompts: call k3model.engine.generate with per-prompt images")
        images = [(images_NCHW, image_mask_BT[0])]
    outs = engine_generate(model, input_ids_BT.tolist(), cfg.sampling(), generator=generator, images=images)
    width = max(len(o.token_ids) for o in outs)
    pad = cfg.eos_id if cfg.eos_id is not None else 0
    new_BN = torch.full((len(outs), width), pad, dtype=torch.long, device=input_ids_BT.device)
    for b, o in enumerate(outs):
        new_BN[b, : len(o.token_ids)] = torch.tensor(o.token_ids, dtype=torch.long)
    return new_BN
