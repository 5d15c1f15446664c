"""Total and active parameter counts of a profile, with no weights allocated.

The model is built on PyTorch's `meta` device, so every count comes from the very modules that train
(no second, hand-kept formula to drift), and the k3 preset's 2.8T parameters cost no memory. Active
parameters are those one token uses: everything except the routed experts it was not sent to, i.e.
total − Σ_MoE layers (routed − top_k/n_routed · routed).

The main model is what K3's 2.8T / 104B describe; the MTP module(s) are counted separately
(`mtp`), as the released checkpoint ships no MTP layers (research/recipe.md §4).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import torch

from k3model.config import ModelConfig, get_profile
from k3model.model import K3Model
from k3model.moe import LatentMoE, moe_param_counts

# Published K3 figures the k3 preset is checked against.
K3_TOTAL = 2.8e12
K3_ACTIVE = 104e9


def _part_of(name: str, model: K3Model) -> str:
    """Which part of the model a parameter name belongs to."""
    head = name.split(".")[0]
    if head in ("embed", "lm_head", "vision", "mtp"):
        return {"embed": "embedding", "lm_head": "lm_head"}.get(head, head)
    if head == "layers":
        layer = model.layers[int(name.split(".")[1])]
        sub = name.split(".")[2]
        if sub == "mixer":
            return f"{layer.mixer_kind}_attention"
        if sub == "ffn":
            return "moe" if isinstance(layer.ffn, LatentMoE) else "dense_ffn"
    return "residual_and_norms"


def count_params(profile: str) -> dict:
    """Counts for `profile`: totals, active, a per-part breakdown and the MoE split."""
    return count_config(get_profile(profile).model, profile)


def count_config(cfg: ModelConfig, profile: str | None = None) -> dict:
    """`count_params` for a model config (e.g. the one a checkpoint's manifest records)."""
    # Fake quantization adds no parameters, and counting must not need the MX kernels.
    cfg = replace(cfg, qat=False)
    with torch.device("meta"):
        model = K3Model(cfg)
    parts: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():
        parts[_part_of(name, model)] += p.numel()
    moe = defaultdict(int)
    for layer in model.moe_layers():
        for key, value in moe_param_counts(layer.cfg).items():
            moe[key] += value
    if moe and moe["total"] != parts["moe"]:
        raise AssertionError(f"moe_param_counts ({moe['total']}) disagrees with the modules ({parts['moe']})")
    total_with_mtp = sum(parts.values())
    total = total_with_mtp - parts.get("mtp", 0)
    inactive = moe["routed"] - moe["routed_active"] if moe else 0
    result = {
        "profile": profile or cfg.name,
        "total": total,
        "active": total - inactive,
        "mtp": parts.get("mtp", 0),
        "total_with_mtp": total_with_mtp,
        "parts": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
        "moe": dict(moe),
        "layers": {"n_layers": cfg.n_layers, "kda": cfg.n_kda_layers, "mla": cfg.n_mla_layers,
                   "dense": cfg.n_dense_layers},
    }
    if profile == "k3":
        result["published"] = {"total": K3_TOTAL, "active": K3_ACTIVE,
                               "total_rel_diff": total / K3_TOTAL - 1, "active_rel_diff": (total - inactive) / K3_ACTIVE - 1}
    return result


def format_counts(counts: dict) -> str:
    """A human-readable table of `count_params`'s result."""
    def fmt(n: float) -> str:
        for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if abs(n) >= size:
                return f"{n / size:.3f}{unit}"
        return str(int(n))
    lines = [f"profile {counts['profile']}: total {fmt(counts['total'])}, active {fmt(counts['active'])}"
             f" (+ MTP {fmt(counts['mtp'])})"]
    for part, n in counts["parts"].items():
        lines.append(f"  {part:<20} {fmt(n):>10}  {100 * n / counts['total_with_mtp']:5.1f} %")
    if counts["moe"]:
        m = counts["moe"]
        lines.append(f"  MoE: routed {fmt(m['routed'])} (active {fmt(m['routed_active'])}), shared {fmt(m['shared'])},"
                     f" latent projections {fmt(m['latent'])}, routers {fmt(m['router'])}")
    if "published" in counts:
        p = counts["published"]
        lines.append(f"  vs published 2.8T / 104B: total {100 * p['total_rel_diff']:+.2f} %, "
                     f"active {100 * p['active_rel_diff']:+.2f} %")
    return "\n".join(lines)
