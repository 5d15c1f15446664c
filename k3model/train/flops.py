"""Counted training FLOPs, for equal-compute comparisons between post-training recipes (issue 19:
MOPD vs the nine specialists' RL vs one generalist GRPO run), counted, not timed.

Per token through the model (Kaplan et al. 2020; Chinchilla's appendix F), with N the parameters one
token multiplies by — the active parameters (`k3model.params.count_config`) less the embedding table
(a lookup), the vision encoder (no image in post-training) and the MTP head (not trained after
pretraining):

    forward  = 2·N + attention,      backward = 2 × forward   (gradients of activations and weights)
    attention (each MLA layer, per token at context position t) = 2·t·H·(d_qk + d_v)
      (QKᵀ and AV: t keys of H heads; the KDA layers' state update is linear in N and already counted)

so a sequence of L tokens costs 2·N·L + n_mla·H·(d_qk + d_v)·L(L+1) forward (Σ_t 2t = L(L+1)), and a
train step (forward + backward) three times that. Decoding a token at position t costs the same
forward as position t of a teacher-forced pass (the cache saves recomputation, not this token's
matmuls). What each recipe counts:

- rollout: every episode's tokens through the sampler's forward (prompts and tool results are
  prefilled, generated tokens decoded one at a time: both one forward per token);
- teacher (MOPD) / old-policy or reference (GRPO) scoring: one forward over each sequence;
- training: one forward + backward over each sequence.

`FlopCounter` keeps the totals by kind; `as_dict()` gives them (and their sum) as floats.
`counting()` counts every K3Model forward run inside it (any trainer, unmodified: the GRPO
specialists and the generalist control are counted exactly as MOPD is) from the ids each forward
is given — padding included, since it is computed — with the cache's length as the context
offset of a decode step; a forward with gradients enabled on a model that has trainable parameters
is counted as forward + backward. (Calls through `model(...)` only: `K3Model.compute_loss` calls
`forward` itself, which module hooks do not see — the post-training trainers call the model.)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import torch

from k3model.config import ModelConfig

BACKWARD_FACTOR = 2.0  # backward ≈ 2 × forward


def matmul_params(cfg: ModelConfig) -> int:
    """N: the active parameters a text token multiplies by (no embedding lookup, vision or MTP)."""
    from k3model.params import count_config
    counts = count_config(cfg)
    parts = counts["parts"]
    embedding = 0 if cfg.tie_embeddings else parts.get("embedding", 0)
    return counts["active"] - embedding - parts.get("vision", 0)


def attention_width(cfg: ModelConfig) -> int:
    """Σ over MLA layers of H·(d_qk + d_v): the per-key multiply-adds of one query."""
    return cfg.n_mla_layers * cfg.mla_heads * (cfg.mla_qk_nope_dim + cfg.mla_qk_rope_dim + cfg.mla_v_head_dim)


def forward_flops(n_params: int, attn_width: int, seq_len: int) -> float:
    """Forward FLOPs of one sequence of `seq_len` tokens: 2·N·L + attn_width·L·(L + 1)."""
    if seq_len < 0:
        raise ValueError(f"seq_len must be ≥ 0, got {seq_len}")
    return 2.0 * n_params * seq_len + float(attn_width) * seq_len * (seq_len + 1)


def train_flops(n_params: int, attn_width: int, seq_len: int) -> float:
    """Forward + backward FLOPs of one sequence: (1 + BACKWARD_FACTOR) × forward."""
    return (1.0 + BACKWARD_FACTOR) * forward_flops(n_params, attn_width, seq_len)


@dataclass
class FlopCounter:
    n_params: int
    attn_width: int
    totals: dict[str, float] = field(default_factory=dict)

    @classmethod
    def for_model(cls, cfg: ModelConfig) -> FlopCounter:
        return cls(matmul_params(cfg), attention_width(cfg))

    def add(self, kind: str, value: float) -> None:
        self.totals[kind] = self.totals.get(kind, 0.0) + value

    def add_forward(self, lengths: int | Iterable[int], kind: str) -> None:
        """One forward over each sequence (a length or several)."""
        for n in [lengths] if isinstance(lengths, int) else lengths:
            self.add(kind, forward_flops(self.n_params, self.attn_width, n))

    def add_train(self, lengths: int | Iterable[int]) -> None:
        """One forward + backward over each sequence."""
        for n in [lengths] if isinstance(lengths, int) else lengths:
            self.add("train", train_flops(self.n_params, self.attn_width, n))

    def add_rollout(self, episodes: Sequence) -> None:
        """The sampler's forwards over each episode's tokens (anything with `token_ids`)."""
        self.add_forward([len(ep.token_ids) for ep in episodes], "rollout")

    def as_dict(self) -> dict[str, float]:
        out = dict(sorted(self.totals.items()))
        out["total"] = sum(self.totals.values())
        return out

    def restore(self, saved: dict[str, float]) -> None:
        self.totals = {k: float(v) for k, v in saved.items() if k != "total"}


def span_attention(attn_width: int, start: int, n: int) -> float:
    """Σ_{t=start+1}^{start+n} attn_width·2t: attention FLOPs of n tokens after `start` cached ones."""
    end = start + n
    return float(attn_width) * (end * (end + 1) - start * (start + 1))


@contextlib.contextmanager
def counting() -> Iterator[FlopCounter]:
    """Count the FLOPs of every K3Model forward inside the block (kinds "forward" and "train");
    models of other sizes than the first are counted with their own N."""
    from k3model.model import K3Model
    counter = FlopCounter(0, 0)
    sizes: dict[int, tuple[int, int]] = {}

    def hook(module, args, kwargs, output) -> None:
        if not isinstance(module, K3Model):
            return
        ids = args[0] if args else kwargs["input_ids_BT"]
        if id(module.cfg) not in sizes:
            sizes[id(module.cfg)] = (matmul_params(module.cfg), attention_width(module.cfg))
        n_params, width = sizes[id(module.cfg)]
        B, T = ids.shape
        cache = kwargs.get("cache") if kwargs else None
        # The hook runs after the forward: the cache already holds this call's tokens.
        starts = [n - T for n in cache.lengths] if cache is not None else [0] * B
        flops = 2.0 * n_params * B * T + sum(span_attention(width, s, T) for s in starts)
        train = torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())
        counter.add("train" if train else "forward", flops * ((1.0 + BACKWARD_FACTOR) if train else 1.0))

    handle = torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True)
    try:
        yield counter
    finally:
        handle.remove()
