"""Block Attention Residuals (Kimi, arXiv 2603.15031; research/recipe.md §3).

Instead of adding every sublayer's output into one residual stream, each sublayer reads a softmax
mixture over depth:

    h = Σ_i α_i v_i,    α = softmax_i( wᵀ RMSNorm(v_i) )

where the sources v_i are the token embedding, the sums of the completed blocks of layers, and the
partial sum of the current block; w is a learned pseudo-query per sublayer, zero-initialized so that
at step 0 every sublayer averages its sources uniformly. The softmax over depth runs in fp32.
The mix runs in C for fp32 CPU sources, in Triton for 2–4 CUDA sources (kernels/attn_res), and
in torch otherwise.
Legend: N sources, B batch, T tokens, D width.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from k3model.common import RMSNorm, softmax0_vectorized
from kernels.attn_res import TRITON_MAX_SOURCES, attn_res_backend, attn_res_cpu, attn_res_mix_triton


class AttnRes(nn.Module):
    """One sublayer's depth mixer: a zero-initialized pseudo-query and a key RMSNorm."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(d_model))
        self.key_norm = RMSNorm(d_model, eps=eps)

    def weights(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """α over the sources: [N, B, T], fp32."""
        return self._alpha([v.float() for v in sources])

    def _alpha(self, v_list_BTD: list[torch.Tensor]) -> torch.Tensor:
        # wᵀ RMSNorm(v) = rsqrt(mean(v²) + eps) · vᵀ(γ ⊙ w), γ the key norm's weight: one dot product
        # per source and token instead of a normalized copy of every source (the same numbers up to
        # fp32 rounding; a third of AttnRes's CPU training time at the tiny size).
        # A broadcast product and sum, not a matvec: the query's gradient is then a pairwise-summed
        # reduction over every token, as before (a matvec's sequential sum was ~10× less accurate,
        # enough to move a zero-initialized query's first AdamW step by 1e-5).
        wq_D = self.key_norm.weight.float() * self.query.float()
        logits_NBT = torch.stack([torch.rsqrt(v.pow(2).mean(-1) + self.key_norm.eps) * (v * wq_D).sum(-1)
                                  for v in v_list_BTD])
        return softmax0_vectorized(logits_NBT)

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        if len(sources) == 1:
            return sources[0]
        if sources[0].device.type == "cpu" and attn_res_backend(sources) == "c":
            # fp32 CPU sources: the whole mix in one C pass each way (kernels/attn_res). The device
            # test first: on CUDA, Dynamo never reaches the eager-only dispatch (no graph break).
            return attn_res_cpu(sources, self.query, self.key_norm.weight, self.key_norm.eps)
        return self._mix(sources)

    def _mix(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """Σ_i α_i v_i in fp32, cast back to the first source's dtype. A method of its own so that
        compiled regions compile it: layer 0's call of `forward` has one source and traces no op, and
        Dynamo then runs `forward`'s code eagerly for good, compiling only what it calls."""
        if sources[0].is_cuda and attn_res_mix_triton is not None and 2 <= len(sources) <= TRITON_MAX_SOURCES:
            # CUDA: one Triton pass each way (kernels/attn_res/triton.py), a custom op that compiled
            # regions keep in their graph; Inductor's kernels for the torch code below read the
            # sources several times and store a stacked fp32 copy (~5× the bandwidth floor).
            return attn_res_mix_triton(sources, self.query, self.key_norm.weight, self.key_norm.eps)
        return self._mix_torch(sources)

    def _mix_torch(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """The mix in torch: every CPU case the C kernel does not take, and CUDA without triton or
        with more than four sources."""
        v_list_BTD = [v.float() for v in sources]
        alpha_NBT = self._alpha(v_list_BTD)
        if torch.compiler.is_compiling():
            # One stacked product and sum, which Inductor fuses. The source-by-source sum below,
            # compiled together with α, gets the sources' gradients wrong at N = 3 on CUDA (Inductor,
            # torch 2.11: 190–420 % off; probes-archive:benchmarks/probes/attn_res_mix_grads.py).
            h_BTD = (alpha_NBT.unsqueeze(-1) * torch.stack(v_list_BTD)).sum(0)
        else:
            # Source by source, never stacked: the [N, B, T, D] copy of the sources (and its
            # backward) was half of AttnRes's eager time at N = 3 (docs/log/tiny.md). Σ_i α_i v_i is
            # added left to right, as sum(0) over the stack added it.
            alpha_list_BT = alpha_NBT.unbind(0)
            h_BTD = alpha_list_BT[0].unsqueeze(-1) * v_list_BTD[0]
            for alpha_BT, v_BTD in zip(alpha_list_BT[1:], v_list_BTD[1:]):
                h_BTD = h_BTD + alpha_BT.unsqueeze(-1) * v_BTD
        return h_BTD.to(sources[0].dtype)


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
