"""Fused input projections for serving frozen weights (issue 44 item 4).

A decode step at batch 1 is a chain of small GEMMs: on the H200 the small profile's captured step
launched 548 a token at ~3 % of the bandwidth floor (docs/log/serve.md). Several of them read the
same input, so `fuse_projections(model)` gives each such module one weight, its members' weights
stacked along the output dimension, and one GEMM whose output is split back:

    [y_1 | … | y_n] = x [W_1; …; W_n]ᵀ + [b_1; …; b_n]        b_i = 0 for a member without a bias

    KDALayer   q_proj k_proj v_proj f_down b_proj g_proj        6 GEMMs → 1
    GatedMLA   q_proj (q_down with q_rank) kv_down g_proj       3 → 1
    LatentMoE  latent_down shared.w_gate shared.w_up            3 → 1 (1 without shared experts: left alone)
    DenseFFN   w_gate w_up                                      2 → 1 (not a LatentMoE's shared experts:
                                                                      the MoE's fusion covers them)

The MoE's router stays a GEMM of its own: it runs in fp32 under autocast and pads its rows on CUDA
(moe.py `LatentMoE.route`), which a shared GEMM in the autocast dtype would not. MXFP4 serving
(k3model/quantize.py) replaces only the routed experts, which no fusion touches: quantize first, then
fuse (a module swapped in after fusing comes unfused; `fuse_projections` again covers it).

Each module's `in_projections(x)` is the seam (the members' outputs, in the table's order); fusing
overrides it on the instance, as compile_regions overrides `_attend_expanded`, and `unfuse_projections`
removes the override. Same maths and shapes downstream: the split outputs are views of one [.., Σ out]
tensor, and the one GEMM may round differently in the last bits from n narrower ones (another kernel
for another width; tests/k3model/test_fused.py bounds it).

Inference only. The fused weight is a copy: an optimizer step, load_state_dict or qk_clip_ would
change the members and not it. So the model's Parameters stay what they were (the copies are
non-persistent buffers `fused_in_weight` / `fused_in_bias`: `state_dict()` is unchanged, and
`.to()` / `.cuda()` / `.half()` move and cast the copies with the Parameters), and a fused forward
raises ValueError when the module is in training mode, when grad is enabled and a member requires
grad, or when a member changed in place since fusing (its version counter moved; fuse again to
refresh). A captured CUDA graph replays without these checks: fuse only models whose weights no
longer change — serving (`k3model.server.load_served`), not training, RL rollouts (their captured
steps are reused across optimizer steps) or evaluation during training.
"""

from __future__ import annotations

import copy
import logging
import types
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3model.kda_layer import KDALayer
from k3model.mla import GatedMLA
from k3model.moe import DenseFFN, LatentMoE

logger = logging.getLogger("k3model.fused")

WEIGHT = "fused_in_weight"
BIAS = "fused_in_bias"
_RECORD = "_fused_projections"


@dataclass(frozen=True)
class _Fusion:
    """What a fused module was fused from: member names (its `in_projections` order), their output
    widths, their Parameters and those Parameters' version counters at fusing."""
    members: tuple[str, ...]
    sizes: tuple[int, ...]
    params: tuple[nn.Parameter, ...]
    versions: tuple[int, ...]

    def __deepcopy__(self, memo: dict) -> "_Fusion":
        # A deep copy of a fused model (draft_from_mtp copies the MTP block) holds copies of the
        # members and of the fused weight, equal to each other: the record follows the copied
        # Parameters, which start new version counters.
        params = tuple(copy.deepcopy(p, memo) for p in self.params)
        return _Fusion(self.members, self.sizes, params, tuple(p._version for p in params))


def fusable_members(module: nn.Module) -> tuple[str, ...]:
    """The Linear submodules whose outputs `module.in_projections` returns, in its order (see the
    module docstring's table); () for a module with nothing to fuse."""
    if isinstance(module, KDALayer):
        return ("q_proj", "k_proj", "v_proj", "f_down", "b_proj", "g_proj")
    if isinstance(module, GatedMLA):
        return ("q_proj" if module.cfg.q_rank is None else "q_down", "kv_down", "g_proj")
    if isinstance(module, LatentMoE):
        return () if module.shared is None else ("latent_down", "shared.w_gate", "shared.w_up")
    if isinstance(module, DenseFFN):
        return ("w_gate", "w_up")
    return ()


def _fused_in_projections(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`in_projections` of a fused module: one GEMM, its output split by member."""
    fusion: _Fusion = getattr(module, _RECORD)
    kind = type(module).__name__
    if module.training:
        raise ValueError(f"this {kind} runs fused projections (k3model.fused), which are inference-only: an "
                         "optimizer step would update the original weights, not the fused copy. Call "
                         "k3model.fused.unfuse_projections(model) before model.train()")
    if torch.is_grad_enabled() and any(p.requires_grad for p in fusion.params):
        raise ValueError(f"this {kind} runs fused projections (k3model.fused) with grad enabled: gradients would "
                         "not reach the original weights. Run it under torch.no_grad() / torch.inference_mode(), or "
                         "call k3model.fused.unfuse_projections(model) first")
    # Dynamo (compile_regions) traces this function: the version counters are checked in eager calls only.
    if not torch.compiler.is_compiling() and tuple(p._version for p in fusion.params) != fusion.versions:
        raise ValueError(f"the weights of this {kind}'s projections changed in place since fuse_projections "
                         "(load_state_dict, an optimizer step, qk_clip_): call k3model.fused.fuse_projections(model) "
                         "again to refresh the fused copy, or unfuse_projections(model)")
    return F.linear(x, getattr(module, WEIGHT), getattr(module, BIAS)).split(fusion.sizes, dim=-1)


def _is_current(module: nn.Module) -> bool:
    fusion = getattr(module, _RECORD, None)
    return fusion is not None and tuple(p._version for p in fusion.params) == fusion.versions


@torch.no_grad()
def _fuse(module: nn.Module, members: tuple[str, ...]) -> None:
    linears = [module.get_submodule(name) for name in members]
    weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    bias = None
    if any(lin.bias is not None for lin in linears):
        bias = torch.cat([lin.bias.detach() if lin.bias is not None else lin.weight.new_zeros(lin.out_features)
                          for lin in linears])
    params = tuple(p for lin in linears for p in lin.parameters())
    module.register_buffer(WEIGHT, weight, persistent=False)
    module.register_buffer(BIAS, bias, persistent=False)
    setattr(module, _RECORD, _Fusion(members, tuple(lin.out_features for lin in linears), params,
                                     tuple(p._version for p in params)))
    module.in_projections = types.MethodType(_fused_in_projections, module)


def _unfuse(module: nn.Module) -> None:
    for name in (WEIGHT, BIAS, _RECORD, "in_projections"):
        if name in module._buffers or name in module.__dict__:
            delattr(module, name)


def _targets(model: nn.Module) -> list[tuple[str, nn.Module, tuple[str, ...]]]:
    covered = {id(m.shared) for m in model.modules() if isinstance(m, LatentMoE) and fusable_members(m)}
    return [(name, m, fusable_members(m)) for name, m in model.named_modules()
            if fusable_members(m) and id(m) not in covered]


def fuse_projections(model: nn.Module) -> nn.Module:
    """Fuse the input projections of every KDA layer, MLA layer, LatentMoE and dense FFN of `model`
    (in eval mode) in place; returns the model. Idempotent: a module already fused from its current
    weights is left as it is, one whose weights changed since is fused again. See the module docstring."""
    if model.training:
        raise ValueError("fuse_projections is for inference (frozen weights): call model.eval() first; training "
                         "updates the original weights, which the fused copies would not follow")
    fused = refreshed = gemms = 0
    for _, module, members in _targets(model):
        gemms += len(members) - 1
        if _is_current(module):
            continue
        if getattr(module, _RECORD, None) is not None:
            _unfuse(module)
            refreshed += 1
        _fuse(module, members)
        fused += 1
    if fused:
        logger.info("fused the input projections of %d modules (%d refreshed): %d fewer GEMMs per forward",
                    fused, refreshed, gemms)
    return model


def unfuse_projections(model: nn.Module) -> nn.Module:
    """Undo `fuse_projections`: the modules compute their projections from their own Linears again
    and the fused copies are freed. Returns the model; a no-op on an unfused model."""
    n = 0
    for module in model.modules():
        if getattr(module, _RECORD, None) is not None:
            _unfuse(module)
            n += 1
    if n:
        logger.info("unfused the input projections of %d modules", n)
    return model


def fused_modules(model: nn.Module) -> list[str]:
    """The qualified names of the modules of `model` that run fused projections."""
    return [name for name, m in model.named_modules() if getattr(m, _RECORD, None) is not None]
