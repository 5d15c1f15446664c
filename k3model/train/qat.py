"""Quantization-aware training switched on for a built model, from outside it (torchao's "prepare").

K3 trains with QAT from SFT onward (report §4.1.4; research/recipe.md §7b): the routed experts'
weights are fake-quantized to MXFP4 (E2M1 elements, one E8M0 scale per 32 along the reduction
dimension) and their matmul inputs to MXFP8 (E4M3) on every forward, with a straight-through
estimator, so the fp32 master weights train while the forward sees what the exported MXFP4 model
computes. Router, latent projections, shared experts, attention and embeddings stay in high precision.

    model = load_pretrained(base_dir)[0]
    prepare_qat(model)          # every LatentMoE now fake-quantizes through kernels.mx.fake_quant_mx

The quantizer is `kernels.mx.fake_quant_mx`, the one export uses too; `prepare_qat` hands it to each
LatentMoE's quantization hook, which is exactly what building the model with `ModelConfig(qat=True)`
does, so a prepared model computes bit for bit what a QAT-built one does (tested). The model files
stay free of training modes, as `k3model.parallel` wraps a model from outside.

While the weights stay fixed (a rollout, an evaluation: `frozen_expert_weights(model)`), fq(W) of
each expert stack is the same on every forward, so it is computed once per stack and reused; the
activations are still quantized on every forward. A decode step of the tiny policy spent ~40 % of
its time re-quantizing the same weights (docs/log/posttrain-assets.md, 2026-12-01).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn as nn

from k3model.moe import MX_BLOCK, LatentMoE

QAT_SCHEME = {"modules": "LatentMoE routed experts", "weights": "fp4_e2m1", "activations": "fp8_e4m3",
              "block_size": MX_BLOCK, "gradient": "straight-through", "quantizer": "kernels.mx.fake_quant_mx"}


def prepare_qat(model: nn.Module, scale_rounding: str = "ceil") -> nn.Module:
    """Turn on MXFP4-weight / MXFP8-activation fake quantization in every LatentMoE of `model`
    (in place; returns it). `scale_rounding` is kernels.mx's: "ceil" (RCEIL, the default) or "floor"
    (OCP); export with the same one (k3model.quantize checks). Raises ValueError when the model has
    no LatentMoE or a width is not a multiple of the MX block."""
    from kernels.mx import SCALE_ROUNDINGS, fake_quant_mx

    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding={scale_rounding!r}: use one of {SCALE_ROUNDINGS}")
    quantizer = fake_quant_mx if scale_rounding == "ceil" else functools.partial(fake_quant_mx, scale_rounding=scale_rounding)

    moes = [m for m in model.modules() if isinstance(m, LatentMoE)]
    if not moes:
        raise ValueError("prepare_qat found no LatentMoE in the model: QAT here quantizes the routed "
                         "experts, so the model needs MoE layers (n_layers > n_dense_layers)")
    for moe in moes:
        for name in ("latent_dim", "expert_hidden"):
            if getattr(moe.cfg, name) % MX_BLOCK:
                raise ValueError(f"QAT quantizes in MX blocks of {MX_BLOCK} along {name}, but the model's "
                                 f"{name} is {getattr(moe.cfg, name)}: choose a multiple of {MX_BLOCK}")
        moe.fake_quant_mx = quantizer
    return model


def qat_enabled(model: nn.Module) -> bool:
    """True when every LatentMoE of `model` fake-quantizes its experts."""
    moes = [m for m in model.modules() if isinstance(m, LatentMoE)]
    return bool(moes) and all(m.fake_quant_mx is not None for m in moes)


def _reuse_weights(t: torch.Tensor, fmt: str, *, quantizer, frozen: dict, scale_rounding: str) -> torch.Tensor:
    """`quantizer(t, fmt)`, from `frozen` for a parameter quantized before at the same version."""
    if not isinstance(t, nn.Parameter):
        return quantizer(t, fmt)
    key = (id(t), fmt)
    hit = frozen.get(key)
    # The version counter moves with every in-place update (an optimizer step, load_state_dict):
    # a weight changed inside the scope is quantized again, never served stale.
    if hit is None or hit[0] is not t or hit[1] != t._version:
        with torch.no_grad():
            hit = (t, t._version, quantizer(t, fmt))
        frozen[key] = hit
    return hit[2]


@contextlib.contextmanager
def frozen_expert_weights(model: nn.Module) -> Iterator[nn.Module]:
    """Inside: every QAT LatentMoE of `model` fake-quantizes each expert weight stack once and
    reuses it (bit for bit the same values; the straight-through gradient is unchanged, as the
    quantized weights enter the forward only through a detached difference). Models without QAT
    pass through unchanged."""
    saved = [(m, m.fake_quant_mx) for m in model.modules()
             if isinstance(m, LatentMoE) and m.fake_quant_mx is not None]
    frozen: dict = {}
    try:
        for moe, quantizer in saved:
            rounding = quantizer.keywords.get("scale_rounding", "ceil") if isinstance(quantizer, functools.partial) else "ceil"
            # A partial with scale_rounding, as prepare_qat's: k3model.quantize reads the rounding from it.
            moe.fake_quant_mx = functools.partial(_reuse_weights, quantizer=quantizer, frozen=frozen,
                                                  scale_rounding=rounding)
        yield model
    finally:
        for moe, quantizer in saved:
            moe.fake_quant_mx = quantizer
