"""Autoregressive generation with the model cache: one prefill, then one token per step.

KDA layers carry a fixed-size state (conv windows + one K×V matrix per head) and MLA layers carry
their latent, so each decode step costs O(1) in KDA and O(length) only in the MLA layers.
Greedy when temperature == 0, else sampling from softmax(logits / temperature), optionally top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k3model.model import K3Model, ModelCache


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int | None = None
    eos_id: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be ≥ 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0 (0 is greedy), got {self.temperature}")


def sample_next(logits_BV: torch.Tensor, cfg: GenerationConfig, generator: torch.Generator | None = None):
    if cfg.temperature == 0:
        return logits_BV.argmax(-1)
    logits_BV = logits_BV.float() / cfg.temperature
    if cfg.top_k is not None:
        kth = logits_BV.topk(cfg.top_k, dim=-1).values[:, -1:]
        logits_BV = logits_BV.masked_fill(logits_BV < kth, float("-inf"))
    return torch.multinomial(logits_BV.softmax(-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: K3Model, input_ids_BT: torch.Tensor, cfg: GenerationConfig = GenerationConfig(),
             images_NCHW=None, image_mask_BT=None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Returns the new tokens [B, ≤ max_new_tokens]; rows that hit eos are padded with eos."""
    out = model(input_ids_BT, images_NCHW, image_mask_BT, use_cache=True)
    cache: ModelCache = out.cache
    logits_BV = out.logits_BTV[:, -1]
    finished = torch.zeros(input_ids_BT.shape[0], dtype=torch.bool, device=input_ids_BT.device)
    new_tokens = []
    for _ in range(cfg.max_new_tokens):
        token_B = sample_next(logits_BV, cfg, generator)
        if cfg.eos_id is not None:
            token_B = token_B.masked_fill(finished, cfg.eos_id)
            finished |= token_B == cfg.eos_id
        new_tokens.append(token_B)
        if cfg.eos_id is not None and bool(finished.all()):
            break
        out = model(token_B.unsqueeze(1), cache=cache)
        cache, logits_BV = out.cache, out.logits_BTV[:, -1]
    if not new_tokens:
        return input_ids_BT.new_zeros(input_ids_BT.shape[0], 0)
    return torch.stack(new_tokens, dim=1)
