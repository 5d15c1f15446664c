"""Quantization-aware training switched on for a built model, from outside it (torchao's "prepare").

K3 trains with QAT from SFT onward (report §4.1.4; research/recipe.md §7b): the routed experts'
weights are fake-quantized to MXFP4 (E2M1 elements, one E8M0 scale per 32 along the reduction
dimension) and their matmul inputs to MXFP8 (E4M3) on every forward, with a straight-through
estimator, so the fp32 master weights train while the forward sees what the exported MXFP4 model
computes. Router, latent projections, shared experts, attention and embeddings stay in high precision.

    model = load_model(base_dir, qat=False)[0]   # k3model.checkpoint
    prepare_qat(model)          # every LatentMoE now fake-quantizes through kernels.mx.fake_quant_mx

The quantizer is `kernels.mx.fake_quant_mx`, the one export uses too; `prepare_qat` hands it to each
LatentMoE's quantization hook, which is exactly what building the model with `ModelConfig(qat=True)`
does, so a prepared model computes bit for bit what a QAT-built one does (tested). The model files
stay free of training modes, as `k3model.parallel` wraps a model from outside.

The scope (`QUANT_SCOPES`) says which weights the one quantizer touches:
- "experts" (K3's, the product's): the routed experts as above;
- "all_linear": the experts as above plus the weight of every other `nn.Linear` fake-quantized to
  MXFP4 along its reduction dimension (weight [out, in], blocks along in) on each call of its
  forward, activations unquantized. It is where PTQ measurably hurts a model of tiny's size
  (claim 5; research/turn3-posttrain.md §3: +0.042 nats at tiny against 0.00 for the experts alone).
  The forward is swapped per instance, so the state dict keeps its keys and a checkpoint loads as
  any other; weights read directly rather than through the forward keep high precision: the
  router's fp32 scores (k3model.moe) and MLA's absorbed decode (k3model.mla), so this scope is for
  teacher-forced forwards (training, held-out NLL), not for serving.

While the weights stay fixed (a rollout, an evaluation: `frozen_expert_weights(model)`), fq(W) of
each expert stack is the same on every forward, so the stacks the forward sees are computed once
and reused; the activations are still quantized on every forward. A decode step of the tiny policy spent ~40 % of
its time re-quantizing the same weights (docs/log/posttrain-assets.md, 2026-12-01). For the scope
the stacks are non-persistent buffers of their LatentMoE (`FROZEN_STACKS`): a CUDA graph captured
inside reads them by address, and `engine.reused` keys a graph on its owners' buffers, so a later
scope, whose stacks lie elsewhere once these are freed, captures anew instead of replaying reads of
freed memory.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn as nn

import torch.nn.functional as F

from k3model.moe import MX_BLOCK, LatentMoE

QAT_SCHEME = {"modules": "LatentMoE routed experts", "weights": "fp4_e2m1", "activations": "fp8_e4m3",
              "block_size": MX_BLOCK, "gradient": "straight-through", "quantizer": "kernels.mx.fake_quant_mx"}
# Which weights prepare_qat quantizes (module docstring): K3's routed experts, or those plus every nn.Linear.
QUANT_SCOPES = ("experts", "all_linear")


def check_scope(scope: str) -> str:
    """`scope` when it is one of QUANT_SCOPES, else a ValueError naming them."""
    if scope not in QUANT_SCOPES:
        raise ValueError(f"quantization scope {scope!r} does not exist: use one of {QUANT_SCOPES}")
    return scope


def qat_scheme(scope: str = "experts") -> dict:
    """QAT_SCHEME for `scope` (what a checkpoint's manifest records)."""
    if check_scope(scope) == "experts":
        return dict(QAT_SCHEME)
    return {**QAT_SCHEME, "modules": "LatentMoE routed experts + every nn.Linear (weights only)", "scope": scope}


def prepare_qat(model: nn.Module, scale_rounding: str = "ceil", scope: str = "experts") -> nn.Module:
    """Turn on MXFP4-weight / MXFP8-activation fake quantization in every LatentMoE of `model`
    (in place; returns it) and, with scope "all_linear", MXFP4 weight fake quantization in every
    nn.Linear. `scale_rounding` is kernels.mx's: "ceil" (RCEIL, the default) or "floor"
    (OCP); export with the same one (k3model.quantize checks). Raises ValueError for a scope not in
    QUANT_SCOPES, when the model has no LatentMoE or a width is not a multiple of the MX block."""
    from kernels.mx import SCALE_ROUNDINGS, fake_quant_mx

    check_scope(scope)
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
    if scope == "all_linear":
        for linear in model.modules():
            if isinstance(linear, nn.Linear):
                # An instance attribute shadows nn.Linear.forward; the state dict is untouched.
                linear.forward = functools.partial(_fake_quant_linear_forward, linear, quantizer)
    return model


def _fake_quant_linear_forward(linear: nn.Linear, quantizer, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, quantizer(linear.weight, "fp4_e2m1"), linear.bias)


def linear_fake_quant_enabled(model: nn.Module) -> bool:
    """True when prepare_qat's "all_linear" scope is on in `model` (every nn.Linear fake-quantizes)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return bool(linears) and all("forward" in vars(m) for m in linears)


def qat_enabled(model: nn.Module) -> bool:
    """True when every LatentMoE of `model` fake-quantizes its experts."""
    moes = [m for m in model.modules() if isinstance(m, LatentMoE)]
    return bool(moes) and all(m.fake_quant_mx is not None for m in moes)


# The names under which a LatentMoE holds its frozen stacks for the scope (non-persistent buffers).
FROZEN_STACKS = ("frozen_w_gate_EHL", "frozen_w_up_EHL", "frozen_w_down_ELH")


@contextlib.contextmanager
def frozen_expert_weights(model: nn.Module) -> Iterator[nn.Module]:
    """Inside, without autograd: every QAT LatentMoE of `model` computes its fake-quantized expert
    weight stacks (`LatentMoE._expert_weights`) once, on entry, and reuses them, bit for bit the same
    tensors, refreshed in place when a weight changes in place (its version counter moves: an
    optimizer step, load_state_dict). The stacks are the module's buffers `FROZEN_STACKS` until the
    scope ends (module docstring). With autograd on, and for models without QAT, nothing changes."""
    # An instance attribute shadows the method for the scope (an inner scope leaves an outer one's).
    moes = [m for m in model.modules() if isinstance(m, LatentMoE) and m.fake_quant_mx is not None
            and "_expert_weights" not in vars(m)]
    entered = []
    try:
        for moe in moes:
            entered.append(moe)
            compute = type(moe)._expert_weights.__get__(moe)
            with torch.no_grad():
                memo = {"versions": _versions(moe), "stacks": compute()}
            for name, stack in zip(FROZEN_STACKS, memo["stacks"]):
                moe.register_buffer(name, stack, persistent=False)
            moe._expert_weights = functools.partial(_reused_expert_weights, moe, compute, memo)
        yield model
    finally:
        for moe in entered:
            vars(moe).pop("_expert_weights", None)  # the class's method again
            for name in FROZEN_STACKS:
                moe._buffers.pop(name, None)


def _versions(moe: LatentMoE) -> tuple[int, ...]:
    return tuple(w._version for w in (moe.w_gate_EHL, moe.w_up_EHL, moe.w_down_ELH))


def _reused_expert_weights(moe: LatentMoE, compute, memo: dict) -> tuple[torch.Tensor, ...]:
    # A tensor made without autograd carries no gradient to the weights: training forwards compute.
    if torch.is_grad_enabled():
        return compute()
    versions = _versions(moe)
    if memo["versions"] != versions:
        # In place: a graph captured in this scope reads these very tensors.
        for stack, fresh in zip(memo["stacks"], compute()):
            stack.copy_(fresh)
        memo["versions"] = versions
    return memo["stacks"]
