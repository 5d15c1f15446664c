"""Expert load of a checkpoint on a fixed held-out mixed set: what claim 2 is judged on (DESIGN.md §5:
"expert load stays near k/N with balancing and drifts without it").

For each LatentMoE layer ℓ the routed (token, expert) assignments are summed over every token of the set:

    load_ℓj      = Σ_batches tokens routed to expert j in layer ℓ          (token-aggregated)
    max/mean_ℓ   = max_j load_ℓj / mean_j load_ℓj                         1.0: every expert at k/N
    dead_ℓj      = load_ℓj / T < 0.1 · k/N  ⇔  load_ℓj < 0.1 · mean_j load_ℓj

and reported as the mean over layers (as the training metric `moe/load_max_over_mean` is) and the worst
layer, with the dead fraction over all (layer, expert) pairs and the per-batch spread of the same
ratio (one batch's figure is what a last-10 %-of-steps average of one 8K-token step amounts to).
The same checkpoint is measured again with every routing bias zeroed: the router alone, without what
the balancer put in the bias. Routing is per token, so the figures do not depend on how rows are
batched.

The set is fixed by the data assets alone: held-out corpus text cut into windows, the clue eval grid's
scattered rows, and the held-out VQA rows with their images (datagen's held-out splits; none of them
is trained on). `load_stats` also serves the training-time figure (loads summed over the steps that
make the stage's last 10 % of tokens).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from k3model.model import K3Model
from k3model.train.pretrain_data import PretrainData, pixels_to_tensor

DEAD_SHARE = 0.1  # an expert is dead below this fraction of its k/N share


@dataclass
class MixedSet:
    """Held-out rows as ready batches: (kind, ids [n, L], images or None, image mask or None)."""
    batches: list[tuple[str, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = field(default_factory=list)

    def tokens(self, kind: str | None = None) -> int:
        return sum(b[1].numel() for b in self.batches if kind is None or b[0] == kind)


def mixed_heldout_set(data: PretrainData, image_tokens: int | None, text_tokens: int = 40_960,
                      clue_tokens: int = 16_384, image_rows_tokens: int = 8_192, text_length: int = 512,
                      batch_tokens: int = 4_096) -> MixedSet:
    """About `text_tokens` + `clue_tokens` + `image_rows_tokens` held-out tokens (fewer where a split is
    smaller; `MixedSet.tokens` says how many): text windows of `text_length`, clue rows in corpus order
    grouped by length, VQA rows (prompt + answer) with their images (`image_tokens` None: a model
    without vision, no image rows)."""
    import numpy as np

    from datagen.corpus import split_texts
    from datagen.packing import PackingConfig, vqa_eval_set
    from datagen.tokenizer import EOS, IMAGE, encode_batch

    out = MixedSet()
    tok = data.tokenizer
    eos = tok.token_to_id(EOS)
    stream = [t for doc in encode_batch(tok, split_texts(data.corpus, "heldout")) for t in (*doc, eos)]
    n_windows = min(text_tokens // text_length, len(stream) // text_length)
    if n_windows < 1:
        raise ValueError(f"the held-out split has {len(stream)} tokens, fewer than one {text_length}-token window: "
                         "lower text_length")
    windows = torch.tensor(stream[: n_windows * text_length]).view(n_windows, text_length)
    for chunk in windows.split(max(batch_tokens // text_length, 1)):
        out.batches.append(("text", chunk, None, None))

    def grouped(kind, rows, pixels_of=None):
        by_len = defaultdict(list)
        for r in rows:
            by_len[len(r[0])].append(r)
        for length, group in sorted(by_len.items()):
            per = max(batch_tokens // length, 1)
            for s in range(0, len(group), per):
                part = group[s: s + per]
                ids = torch.tensor([r[0] for r in part])
                if pixels_of is None:
                    out.batches.append((kind, ids, None, None))
                else:
                    images = pixels_of([r[1] for r in part])
                    out.batches.append((kind, ids, images, ids == tok.token_to_id(IMAGE)))

    clue = data.clue_eval
    rows, used = [], 0
    for variant, p, a in zip(clue.column("variant").to_pylist(), clue.column("prompt_ids").to_pylist(),
                             clue.column("answer_ids").to_pylist()):
        if variant != "scattered":
            continue
        if used + len(p) + len(a) > clue_tokens:
            continue  # a smaller row may still fit
        rows.append((list(p) + list(a), None))
        used += len(p) + len(a)
    grouped("clue", rows)

    if image_tokens is not None:
        table = vqa_eval_set(PackingConfig(image_tokens=image_tokens), tokenizer=tok, images=data.images)
        rows, used = [], 0
        for image_id, p, a in zip(table.column("image_id").to_pylist(), table.column("prompt_ids").to_pylist(),
                                  table.column("answer_ids").to_pylist()):
            if used + len(p) + len(a) > image_rows_tokens:
                break
            rows.append((list(p) + list(a), image_id))
            used += len(p) + len(a)
        grouped("image", rows, lambda ids: pixels_to_tensor(data.image_pixels_NHWC[np.array(ids)]))
    return out


def load_stats(loads_NE: torch.Tensor, top_k: int) -> dict[str, float]:
    """max/mean (mean over layers and worst layer) and the dead fraction of [layers, experts] loads."""
    loads_NE = loads_NE.double()
    mean_N = loads_NE.mean(-1)
    if not bool((mean_N > 0).all()):
        raise ValueError("a layer routed no tokens: measure over a set that reaches every MoE layer")
    ratio_N = loads_NE.max(-1).values / mean_N
    dead = loads_NE < DEAD_SHARE * mean_N.unsqueeze(-1)
    n_experts = loads_NE.shape[-1]
    return {"load_max_over_mean": float(ratio_N.mean()), "load_max_over_mean_worst": float(ratio_N.max()),
            "dead_fraction": float(dead.double().mean()), "dead_experts": int(dead.sum()),
            "share_min_over_k_over_n": float((loads_NE.min(-1).values / mean_N).min()),
            "layers": int(loads_NE.shape[0]), "experts": n_experts, "top_k": top_k}


@torch.no_grad()
def expert_load(model: K3Model, heldout: MixedSet, device: str = "cpu", zero_bias: bool = False) -> dict:
    """Token-aggregated expert load of `model` over `heldout` (module docstring), and the per-batch
    spread of max/mean; `zero_bias` measures with every routing bias set to 0 (restored after)."""
    moes = model.moe_layers()
    if not moes:
        raise ValueError("the model has no LatentMoE layer: there is no expert load to measure")
    saved = [m.expert_bias_E.clone() for m in moes]
    model.eval()
    total_NE = torch.zeros(len(moes), moes[0].cfg.n_routed, dtype=torch.float64)
    by_kind: dict[str, torch.Tensor] = {}
    per_batch: list[float] = []
    try:
        if zero_bias:
            for m in moes:
                m.expert_bias_E.zero_()
        for kind, ids, images, mask in heldout.batches:
            model(ids.to(device), None if images is None else images.to(device),
                  None if mask is None else mask.to(device))
            loads_NE = torch.stack([m.last_load.double().cpu() for m in moes])
            total_NE += loads_NE
            by_kind[kind] = by_kind.get(kind, 0) + loads_NE
            per_batch.append(float((loads_NE.max(-1).values / loads_NE.mean(-1)).mean()))
    finally:
        for m, b in zip(moes, saved):
            m.expert_bias_E.copy_(b)
    top_k = moes[0].cfg.top_k
    out = load_stats(total_NE, top_k)
    out["by_kind"] = {k: load_stats(v, top_k)["load_max_over_mean"] for k, v in by_kind.items()}
    out["per_batch"] = {"n": len(per_batch), "mean": statistics.fmean(per_batch), "min": min(per_batch),
                        "max": max(per_batch),
                        "sd": statistics.stdev(per_batch) if len(per_batch) > 1 else 0.0}
    out["tokens"] = heldout.tokens()
    out["tokens_by_kind"] = {k: heldout.tokens(k) for k in by_kind}
    return out


def checkpoint_expert_load(model: K3Model, heldout: MixedSet, device: str = "cpu") -> dict:
    """`expert_load` with the checkpoint's bias and with it zeroed: {"with_bias": …, "bias_zeroed": …}
    (one pass where every bias is already 0, as in a model trained with `balancing: none`)."""
    with_bias = expert_load(model, heldout, device)
    unbiased = all(bool((m.expert_bias_E == 0).all()) for m in model.moe_layers())
    zeroed = with_bias if unbiased else expert_load(model, heldout, device, zero_bias=True)
    return {"with_bias": with_bias, "bias_zeroed": zeroed}


def flat_metrics(measured: dict, prefix: str = "moe/heldout") -> dict[str, float]:
    """The headline numbers of `checkpoint_expert_load` as flat floats (asset metadata, logs)."""
    out = {}
    for arm, suffix in (("with_bias", ""), ("bias_zeroed", "_bias_zeroed")):
        m = measured[arm]
        out[f"{prefix}_load_max_over_mean{suffix}"] = m["load_max_over_mean"]
        out[f"{prefix}_load_max_over_mean_worst{suffix}"] = m["load_max_over_mean_worst"]
        out[f"{prefix}_dead_fraction{suffix}"] = m["dead_fraction"]
        out[f"{prefix}_per_batch_sd{suffix}"] = m["per_batch"]["sd"]
        out[f"{prefix}_per_batch_max{suffix}"] = m["per_batch"]["max"]
    out[f"{prefix}_tokens"] = float(measured["with_bias"]["tokens"])
    assert all(math.isfinite(v) for v in out.values()), out
    return out
