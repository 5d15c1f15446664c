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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

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

    def _add(self, kind: str, value: float) -> None:
        self.totals[kind] = self.totals.get(kind, 0.0) + value

    def add_forward(self, lengths: int | Iterable[int], kind: str) -> None:
        """One forward over each sequence (a length or several)."""
        for n in [lengths] if isinstance(lengths, int) else lengths:
            self._add(kind, forward_flops(self.n_params, self.attn_width, n))

    def add_train(self, lengths: int | Iterable[int]) -> None:
        """One forward + backward over each sequence."""
        for n in [lengths] if isinstance(lengths, int) else lengths:
            self._add("train", train_flops(self.n_params, self.attn_width, n))

    def add_rollout(self, episodes: Sequence) -> None:
        """The sampler's forwards over each episode's tokens (anything with `token_ids`)."""
        self.add_forward([len(ep.token_ids) for ep in episodes], "rollout")

    def as_dict(self) -> dict[str, float]:
        out = dict(sorted(self.totals.items()))
        out["total"] = sum(self.totals.values())
        return out

    def restore(self, saved: dict[str, float]) -> None:
        self.totals = {k: float(v) for k, v in saved.items() if k != "total"}
