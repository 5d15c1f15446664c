"""An EAGLE-3-style draft model for speculative decoding, initialised from the target's MTP module
(EAGLE-3, arXiv 2503.01840, SafeAILab/EAGLE `eagle/traineagle3/cnets.py`; DeepSeek-V3 MTP;
research/recipe.md §4, research/posttrain-anchors.md §5).

    f_i   = W_fuse [h_low,i; h_mid,i; h_high,i]         the target's features at position i (3D → D)
    g_i   = Block( W_merge [RMSNorm(f_i); RMSNorm(Emb(t_{i+1}))] )   one decoder layer (MLA + dense FFN)
    q(t_{i+2} | ·) = softmax(LMHead(RMSNorm(AttnRes_out(g_i))))

h_low and h_mid are the inputs of two of the target's layers (what their mixer norms read, after
the depth mixing of attention residuals), h_high the target's final hidden state, the one the MTP
module reads. A chain of drafts feeds the draft's own g in place of f after its first step
(EAGLE-3's training-time test trains exactly that): step j reads (g_{n+j−1}, d_j) and proposes d_{j+1}.
The draft layer attends over its own cache of every earlier position, so it is one MLA block
decoding beside the target, with a ModelCache of its own (k3model/cache.py; MLA needs no state
rollback, only a length).

Initialisation from MTP: W_fuse = [0, 0, I] passes h_high through, and the norms, merge, block,
output mixer, final norm and head are copies of the target's MTP depth 1 and head, so the untrained
draft at its first step is exactly the target's MTP prediction. Trained weights (training is the
`draft_model` asset's business) load into the same class with `load_state_dict`.
Legend: B batch, T tokens, D width, V vocabulary.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn

from k3model.attn_res import BlockResidualStream


@dataclass(frozen=True)
class DraftConfig:
    vocab_size: int  # the target's vocabulary: the draft proposes the target's ids
    d_model: int  # the target's width: the draft reads its hidden states
    feature_layers: tuple[int, int]  # the target layers whose inputs are the low and middle features


def feature_layers_for(n_layers: int) -> tuple[int, int]:
    """EAGLE-3 reads layers 2, L/2 and L−3 of a deep target; here the inputs of layers 2 (1 in a
    4-layer target) and L/2, with the final hidden state as the high features (the one MTP reads)."""
    return (min(2, max(1, n_layers // 2 - 1)), max(1, n_layers // 2))


class DraftModel(nn.Module):
    """The draft network; `layers` holds its one decoder block so ModelCache.empty(draft, ...) builds
    its cache like a target's."""

    def __init__(self, cfg: DraftConfig, embed: nn.Embedding, block: nn.Module, hidden_norm: nn.Module,
                 embed_norm: nn.Module, merge: nn.Linear, out_res: nn.Module, final_norm: nn.Module,
                 lm_head: nn.Linear):
        super().__init__()
        self.cfg = cfg
        D = cfg.d_model
        self.fuse = nn.Linear(3 * D, D, bias=False)
        self.embed, self.hidden_norm, self.embed_norm, self.merge = embed, hidden_norm, embed_norm, merge
        self.layers = nn.ModuleList([block])
        self.out_res, self.final_norm, self.lm_head = out_res, final_norm, lm_head

    def fuse_features(self, features: list[torch.Tensor]) -> torch.Tensor:
        """[h_low; h_mid; h_high] [B, T, 3D] → f [B, T, D]."""
        return self.fuse(torch.cat(features, dim=-1))

    def forward(self, hidden_BTD: torch.Tensor, next_ids_BT: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft forward over T positions into `cache` (a ModelCache of this draft): hidden_BTD
        is f (fused target features) or the draft's own g, next_ids_BT the token after each
        position. Returns (g [B, T, D], logits of the token after that [B, T, V])."""
        cache.check(self, hidden_BTD.shape[0])
        x_BTD = self.merge(torch.cat([self.hidden_norm(hidden_BTD), self.embed_norm(self.embed(next_ids_BT))], dim=-1))
        stream = BlockResidualStream(x_BTD)
        cache.set_layer(0, self.layers[0](stream, cache.layers[0], use_cache=True))
        cache.advance(next_ids_BT.shape[1])
        g_BTD = self.out_res(stream.sources())
        return g_BTD, self.lm_head(self.final_norm(g_BTD))


def draft_from_mtp(target) -> DraftModel:
    """An EAGLE-3-style draft for `target` (a K3Model) initialised from its first MTP depth; see the
    module docstring. The draft owns copies of the target's embedding and head (frozen or trained
    with it, as its trainer decides)."""
    if len(target.mtp) == 0:
        raise ValueError("this target has no MTP module (cfg.mtp_depth = 0); give it mtp_depth ≥ 1 "
                         "or build a DraftModel from fresh weights")
    tc = target.cfg
    cfg = DraftConfig(tc.vocab_size, tc.d_model, feature_layers_for(tc.n_layers))
    mtp = target.mtp[0]
    draft = DraftModel(cfg, copy.deepcopy(target.embed), copy.deepcopy(mtp.block), copy.deepcopy(mtp.hidden_norm),
                       copy.deepcopy(mtp.embed_norm), copy.deepcopy(mtp.merge), copy.deepcopy(mtp.out_res),
                       copy.deepcopy(target.final_norm), copy.deepcopy(target.lm_head))
    D = tc.d_model
    param = next(target.parameters())
    with torch.no_grad():
        weight = torch.zeros(D, 3 * D, device=param.device, dtype=param.dtype)
        weight[:, 2 * D:] = torch.eye(D, device=param.device, dtype=param.dtype)
        draft.fuse.weight.copy_(weight)
    return draft.to(device=param.device, dtype=param.dtype)


def check_draft(target, draft: DraftModel) -> None:
    """ValueError unless `draft` was built for a target of this vocabulary and width."""
    tc, dc = target.cfg, draft.cfg
    if dc.vocab_size != tc.vocab_size:
        raise ValueError(f"the draft proposes ids of a {dc.vocab_size}-token vocabulary but the target has "
                         f"{tc.vocab_size}; build the draft for this target (draft_from_mtp(target))")
    if dc.d_model != tc.d_model:
        raise ValueError(f"the draft reads {dc.d_model}-wide features but the target is {tc.d_model} wide; "
                         "build the draft for this target (draft_from_mtp(target))")
    if max(dc.feature_layers) >= tc.n_layers:
        raise ValueError(f"the draft reads features of target layers {dc.feature_layers} but the target has "
                         f"{tc.n_layers} layers; build the draft for this target (draft_from_mtp(target))")


@contextmanager
def target_features(target, draft: DraftModel):
    """Inside the block, each forward of `target` leaves its low and middle features (the inputs of
    the draft's feature layers, [B, T, D]) in the yielded dict under "low" and "mid"; the high
    features are that forward's own hidden_BTD."""
    seen: dict[str, torch.Tensor] = {}
    low, mid = draft.cfg.feature_layers

    def keeper(names):
        def keep(module, args):
            for name in names:
                seen[name] = args[0]
        return keep

    names_of = {low: ["low"], mid: ["mid"]} if low != mid else {low: ["low", "mid"]}
    handles = [target.layers[i].mixer_norm.register_forward_pre_hook(keeper(names)) for i, names in names_of.items()]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
