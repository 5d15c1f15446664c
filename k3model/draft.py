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
import torch.nn.functional as F

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

    def forward(self, hidden_BTD: torch.Tensor, next_ids_BT: torch.Tensor, cache,
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft forward over T positions into `cache` (a ModelCache of this draft): hidden_BTD
        is f (fused target features) or the draft's own g, next_ids_BT the token after each
        position. Returns (g [B, T, D], logits of the token after that [B, T, V]; with `last_only`,
        of the last position only [B, 1, V] — all a decode loop reads, and the head over a whole
        prompt is most of the draft's prefill)."""
        cache.check(self, hidden_BTD.shape[0])
        x_BTD = self.merge(torch.cat([self.hidden_norm(hidden_BTD), self.embed_norm(self.embed(next_ids_BT))], dim=-1))
        stream = BlockResidualStream(x_BTD)
        cache.set_layer(0, self.layers[0](stream, cache.layers[0], use_cache=True))
        cache.advance(next_ids_BT.shape[1])
        g_BTD = self.out_res(stream.sources())
        return g_BTD, self.head(g_BTD[:, -1:] if last_only else g_BTD)

    def head(self, g_BTD: torch.Tensor) -> torch.Tensor:
        """The draft's logits of the token after next from its output g [..., D] → [..., V]."""
        return self.lm_head(self.final_norm(g_BTD))


    def unroll(self, f_BTD: torch.Tensor, next_ids_BT: torch.Tensor, steps: int, start: int = 0) -> list[torch.Tensor]:
        """EAGLE-3's training-time test without a cache: `steps` draft passes over every position at
        once, pass s reading the draft's own g of pass s−1 at the previous position. Returns g of
        each pass [B, T, D] (`head(g)` gives its logits, which a trainer computes only where it needs
        them); pass s at position i is the s-th chained draft after the target's true features of
        positions ≤ i − s, i.e. what `forward` over a cache gives there (tested), so a loss on it
        trains exactly what speculative decoding runs:

            pass 0: (f_i, x_{i+1}) → g⁰_i, q⁰_i(x_{i+2})
            pass s: (g^{s−1}_{i−1}, x_{i+1}) → g^s_i, q^s_i(x_{i+2})
            pass s, position i attends to pass-0 keys at j ≤ i − s and to pass-t keys at i − s + t (t = 1…s)

        The attention mask is what the inference cache holds at that draft step (NoPE: no positions,
        so the set of keys is all that matters). Positions i < s have no true prefix; their values are
        defined but meaningless (the trainer masks them). Passes s ≥ 1 run only on positions ≥ `start`
        (zeros before it): pass s at i is exact when i − s + 1 ≥ start, so a trainer that needs
        positions ≥ P only passes start = P − steps + 1 and saves the work on long prompts."""
        if steps < 1:
            raise ValueError(f"steps must be ≥ 1 (pass 0 reads the target's features), got {steps}")
        B, T, D = f_BTD.shape
        start = max(0, min(start, T - 1))
        block = self.layers[0]
        mla = block.mixer
        e_BTD = self.embed_norm(self.embed(next_ids_BT))
        keys: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden_BQD, outs = f_BTD, []
        for s in range(steps):
            offset = 0 if s == 0 else start
            stream = BlockResidualStream(self.merge(torch.cat([self.hidden_norm(hidden_BQD), e_BTD[:, offset:]], dim=-1)))
            a_BQD = block.mixer_norm(block.mixer_res(stream.sources()))
            latent_BQL = mla.kv_down(a_BQD)
            keys.append((mla.kv_norm(latent_BQL[..., : mla.cfg.kv_rank]), latent_BQL[..., mla.cfg.kv_rank:]))
            stream.add(_unrolled_attention(mla, a_BQD, keys, offset))
            stream.add(block.ffn(block.ffn_norm(block.ffn_res(stream.sources()))))
            g_BQD = self.out_res(stream.sources())
            outs.append(g_BQD if offset == 0 else torch.cat([g_BQD.new_zeros(B, offset, D), g_BQD], dim=1))
            # The next pass reads g at the previous position, over its window [start, T).
            hidden_BQD = outs[-1][:, start - 1: T - 1] if start > 0 else torch.cat([g_BQD.new_zeros(B, 1, D), outs[-1][:, :-1]], dim=1)
        return outs


def unrolled_mask(T: int, s: int, device=None) -> torch.Tensor:
    """[T, (s+1)·T] bool, True where pass s's query at position i sees a key: pass-0 keys at
    j ≤ i − s, pass-t keys (t = 1…s) at j = i − s + t."""
    i_T1 = torch.arange(T, device=device).unsqueeze(1)
    j_1T = torch.arange(T, device=device).unsqueeze(0)
    blocks = [j_1T <= i_T1 - s] + [j_1T == i_T1 - s + t for t in range(1, s + 1)]
    return torch.cat(blocks, dim=1)


def _unrolled_attention(mla, x_BQD: torch.Tensor, keys: list[tuple[torch.Tensor, torch.Tensor]],
                        offset: int) -> torch.Tensor:
    """GatedMLA's expanded attention (mla._attend_expanded) for the queries of the newest pass s at
    positions offset … offset + Q − 1, over pass 0's keys (all T positions) and the earlier passes'
    (over the same window as the queries), under `unrolled_mask`, computed by its structure: a
    Q × T block over pass 0's keys (j ≤ i − s) and one key per earlier pass t (at i − s + t), so a
    pass costs one Q × T attention rather than (s + 1)·T × T under a dense mask. Q: window length."""
    cfg = mla.cfg
    B, Q, _ = x_BQD.shape
    H, nope, rope, dv = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
    s = len(keys) - 1

    def expand(c_hat_BTR, k_rope_BTr):
        n = c_hat_BTR.shape[1]
        kv_BTHX = mla.kv_up(c_hat_BTR).view(B, n, H, nope + dv)
        k_BTHQ = torch.cat([kv_BTHX[..., :nope], k_rope_BTr.unsqueeze(2).expand(B, n, H, rope)], dim=-1)
        return k_BTHQ, kv_BTHX[..., nope:]

    q_BQHK = mla.queries(x_BQD).view(B, Q, H, nope + rope) * (nope + rope) ** -0.5
    k0_BTHK, v0_BTHV = expand(*keys[0])
    T = k0_BTHK.shape[1]
    scores_BHQT = torch.einsum("bihq,bjhq->bhij", q_BQHK, k0_BTHK).float()
    i_Q1 = offset + torch.arange(Q, device=x_BQD.device).unsqueeze(1)
    scores_BHQT = scores_BHQT.masked_fill(torch.arange(T, device=x_BQD.device).unsqueeze(0) > i_Q1 - s, float("-inf"))
    # Pass t's key for query r of the window sits at window index r − (s − t) (none for r < s − t).
    diag_k, diag_v = [], []
    for t in range(1, s + 1):
        k_BQHK, v_BQHV = expand(*keys[t])
        pad = s - t
        diag_k.append(torch.cat([k_BQHK.new_zeros(B, pad, H, nope + rope), k_BQHK[:, : Q - pad]], dim=1))
        diag_v.append(torch.cat([v_BQHV.new_zeros(B, pad, H, dv), v_BQHV[:, : Q - pad]], dim=1))
    if diag_k:
        dk_BQHSK, dv_BQHSV = torch.stack(diag_k, dim=3), torch.stack(diag_v, dim=3)
        dscore_BQHS = torch.einsum("bthq,bthsq->bths", q_BQHK, dk_BQHSK).float()
        r_Q1 = torch.arange(Q, device=x_BQD.device).unsqueeze(1)
        missing_QS = r_Q1 < s - torch.arange(1, s + 1, device=x_BQD.device).unsqueeze(0)
        dscore_BQHS = dscore_BQHS.masked_fill(missing_QS.view(1, Q, 1, s), float("-inf"))
        all_BHQX = torch.cat([scores_BHQT, dscore_BQHS.permute(0, 2, 1, 3)], dim=-1)
    else:
        all_BHQX = scores_BHQT
    p_BHQX = all_BHQX.softmax(-1).to(q_BQHK.dtype)
    a_BQHV = torch.einsum("bhij,bjhv->bihv", p_BHQX[..., :T], v0_BTHV)
    if diag_k:
        a_BQHV = a_BQHV + torch.einsum("bhts,bthsv->bthv", p_BHQX[..., T:], dv_BQHSV)
    gate_BQHV = torch.sigmoid(mla.g_proj(x_BQD)).view(B, Q, H, dv)
    return mla.o_proj((a_BQHV * gate_BQHV).reshape(B, Q, H * dv))


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


def draft_manifest(draft: DraftModel, target_manifest: dict | None = None) -> dict:
    """What a draft checkpoint's manifest records about the target it was trained for."""
    return {"draft": {"config": {"vocab_size": draft.cfg.vocab_size, "d_model": draft.cfg.d_model,
                                 "feature_layers": list(draft.cfg.feature_layers)},
                      "target_sha256": (target_manifest or {}).get("sha256")}}


def load_draft(directory, target, verify: bool = True) -> tuple[DraftModel, dict]:
    """A trained draft (a checkpoint written by k3model.train.draft) for `target`: built with
    draft_from_mtp(target), its weights loaded. ValueError when the checkpoint was trained for a
    target of another vocabulary, width or depth. Returns (draft, manifest)."""
    from k3model.checkpoint import load_checkpoint, read_manifest

    manifest = read_manifest(directory)
    recorded = manifest.get("draft", {}).get("config")
    if recorded is None:
        raise ValueError(f"{directory} is not a draft checkpoint (its manifest has no 'draft' block): "
                         "train one with k3model.train.draft.train")
    draft = draft_from_mtp(target)
    check_draft(target, _config_only(recorded))
    if tuple(recorded["feature_layers"]) != draft.cfg.feature_layers:
        raise ValueError(f"{directory} reads target layers {tuple(recorded['feature_layers'])} but a draft for this "
                         f"target reads {draft.cfg.feature_layers}: it was trained for another target; retrain it")
    weights, _ = load_checkpoint(directory, verify=verify, device=next(target.parameters()).device)
    draft.load_state_dict(weights)
    return draft, manifest


class _config_only:
    """Just enough of a DraftModel (its cfg) for check_draft to judge a recorded config."""

    def __init__(self, recorded: dict):
        self.cfg = DraftConfig(int(recorded["vocab_size"]), int(recorded["d_model"]), tuple(recorded["feature_layers"]))
