"""Regional torch.compile of the K3 model for CUDA (issue 22 item 3; issue 16 item 5).

On the H200 the small profile's training step was ~80 % unfused elementwise work between the
matmuls and the KDA kernels (fp32 casts, RMSNorms, AttnRes's depth softmax, the KDA gates, SiTU-GLU,
the MoE's routing glue: tens of thousands of launches a step, each a full pass over a [tokens, width]
tensor; docs/log/gpu.md). `compile_regions(model)` compiles each repeated module separately
("regional compilation"): the 24 layers share one compiled graph per module kind and source count,
so the compile cost is that of a few small graphs, not of 24 layers. What stays eager, on purpose:

- the KDA chunk kernels (`kernels.kda.chunk_kda`: our own Triton launches inside an autograd
  Function; Dynamo would trace their host code) and the decode recurrence
  (`kernels.kda.decode.kda_recurrent_triton`) — a graph break on each side of the call;
- the MoE's balancing statistics (`LatentMoE._observe`: in-place updates of plain tensor
  attributes and a Python-side flag that activation checkpointing toggles);
- the MLA layer over a cache (Python-side lengths that change every step): only its training /
  prefill attention (`_attend_expanded`) is compiled;
- the CPU's C kernels (RMSNorm, AttnRes, the KDA recurrence, its gate and L2 norm) and their dispatch,
  where the CPU tests compile modules.

The maths is the eager modules' own: Inductor fuses their elementwise chains and may round
differently in the last bits (fp32 reductions in another order), nothing else. For decoding, compile
first and then generate: the engine's captured step (`engine.GraphStep`) of a compiled model gives
its compiled eager step's logits bitwise (tests/k3model/test_engine_gpu.py), at about half the
eager modules' step time on the H200 (docs/log/gpu.md). A cache of another layout (the dynamic
cache of a prefill) recompiles the KDA layers and may round differently. The CPU keeps the
eager model (this is never called there by the library); the CPU tests check the same module code.
"""

from __future__ import annotations

import torch

from k3model.attn_res import AttnRes
from k3model.common import RMSNorm
from k3model.mla import GatedMLA
from k3model.moe import DenseFFN, LatentMoE
from k3model.kda_layer import KDALayer

# Module kinds compiled whole. Per kind Dynamo keeps one graph per distinct input structure (AttnRes:
# 1–3 sources; KDA: training vs one decode token; lengths: static first, then dynamic).
_WHOLE = (AttnRes, RMSNorm, DenseFFN, LatentMoE, KDALayer)
RECOMPILE_LIMIT = 64
_ISLANDS_MARKED = False


def mark_eager_islands() -> None:
    """Mark the eager islands once per process (see the module docstring), before anything is
    compiled. The wrappers are no-ops outside compiled code, so eager models in the same process compute
    exactly as before. The CPU's C kernels and their dispatch are marked here, not decorated where
    they live: `torch.compiler.disable` imports Dynamo (~2.5 s), which a process that neither compiles nor
    steps a torch optimizer (the CLI, data, evaluation and decoding) should not pay."""
    global _ISLANDS_MARKED
    if _ISLANDS_MARKED:
        return
    import k3model.attn_res as attn_res
    import k3model.common as common
    import k3model.kda_layer as kda_layer

    disable = torch.compiler.disable
    kda_layer.chunk_kda = disable(kda_layer.chunk_kda)
    if kda_layer.kda_recurrent_triton is not None:
        kda_layer.kda_recurrent_triton = disable(kda_layer.kda_recurrent_triton)
    for module, names in ((kda_layer, ("kda_cpu", "kda_cpu_backend", "kda_l2_norm_cpu", "kda_output_gate_cpu")),
                          (common, ("rms_norm_backend", "rms_norm_cpu")),
                          (attn_res, ("attn_res_backend", "attn_res_cpu"))):
        for name in names:
            setattr(module, name, disable(getattr(module, name)))
    LatentMoE._observe = disable(LatentMoE._observe)
    _ISLANDS_MARKED = True


def compile_regions(model: torch.nn.Module, **compile_kwargs) -> torch.nn.Module:
    """Compile every AttnRes, RMSNorm, KDA layer, dense FFN and LatentMoE of `model` in place
    (`module.compile(**compile_kwargs)`) and each MLA layer's training attention; returns the model.
    Idempotent; other models in the process stay eager."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), RECOMPILE_LIMIT))
    mark_eager_islands()
    for module in model.modules():
        if getattr(module, "_compiled_region", False):
            continue
        if isinstance(module, _WHOLE):
            module.compile(**compile_kwargs)
        elif isinstance(module, GatedMLA):
            # This instance only (an attribute, not the class): other models stay eager.
            module._attend_expanded = torch.compile(module._attend_expanded, **compile_kwargs)
        else:
            continue
        module._compiled_region = True
    return model
