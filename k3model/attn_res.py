"""Block Attention Residuals (Kimi, arXiv 2603.15031; research/recipe.md §3).

Instead of adding every sublayer's output into one residual stream, each sublayer reads a softmax
mixture over depth:

    h = Σ_i α_i v_i,    α = softmax_i( wᵀ RMSNorm(v_i) )

where the sources v_i are the token embedding, the sums of the completed blocks of layers, and the
partial sum of the current block; w is a learned pseudo-query per sublayer, zero-initialized so that
at step 0 every sublayer averages its sources uniformly. The softmax over depth runs in fp32.
Legend: N sources, B batch, T tokens, D width.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from k3model.common import RMSNorm


class AttnRes(nn.Module):
    """One sublayer's depth mixer: a zero-initialized pseudo-query and a key RMSNorm."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(d_model))
        self.key_norm = RMSNorm(d_model, eps=eps)

    def weights(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """α over the sources: [N, B, T], fp32."""
        return self._alpha(torch.stack(sources))

    def _alpha(self, v_NBTD: torch.Tensor) -> torch.Tensor:
        # wᵀ RMSNorm(v) = rsqrt(mean(v²) + eps) · vᵀ(γ ⊙ w), γ the key norm's weight: one dot product
        # per source and token instead of a normalized copy of every source (the same numbers up to
        # fp32 rounding; a third of AttnRes's CPU training time at the tiny size).
        v = v_NBTD.float()
        inv_rms_NBT = torch.rsqrt(v.pow(2).mean(-1) + self.key_norm.eps)
        # A broadcast product and sum, not a matvec: the query's gradient is then a pairwise-summed
        # reduction over every token, as before (a matvec's sequential sum was ~10× less accurate,
        # enough to move a zero-initialized query's first AdamW step by 1e-5).
        logits_NBT = inv_rms_NBT * (v * (self.key_norm.weight.float() * self.query.float())).sum(-1)
        return logits_NBT.softmax(dim=0)

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        if len(sources) == 1:
            return sources[0]
        v_NBTD = torch.stack(sources)
        alpha_NBT = self._alpha(v_NBTD)
        return (alpha_NBT.unsqueeze(-1) * v_NBTD.float()).sum(0).to(sources[0].dtype)


class BlockResidualStream:
    """The stack of block summaries one forward pass carries through the layers.

    `sources()` lists what the next sublayer may read; `add(out)` adds a sublayer's output to the
    current partial block; `close_block()` pushes the partial sum onto the stack.
    """

    def __init__(self, embedding_BTD: torch.Tensor):
        self.blocks = [embedding_BTD]
        self.partial: torch.Tensor | None = None

    def sources(self) -> list[torch.Tensor]:
        return self.blocks + ([self.partial] if self.partial is not None else [])

    def add(self, out_BTD: torch.Tensor) -> None:
        self.partial = out_BTD if self.partial is None else self.partial + out_BTD

    def close_block(self) -> None:
        if self.partial is not None:
            self.blocks.append(self.partial)
            self.partial = None
