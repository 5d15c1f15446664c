"""Kimi Delta Attention (KDA) kernels with fla's public signature (DESIGN.md §8).

`chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False)
-> (o, final_state)`: `[B, T, H, K]` layout, `g` the per-token log decay, `beta` `[B, T, H]`,
states `[B, H, K, V]` in fp32, scale 1/√K by default. `naive_recurrent_kda` is the reference.

Paths, chosen by the tensors' device and never switched silently:
- "triton" (`chunk_triton.py`, `decode.py`): CUDA tensors. Limits: 16 ≤ K ≤ 128, 16 ≤ V ≤ 256;
  anything else raises ValueError naming the limit (pass backend="torch" to run it in torch).
- "torch" (`chunk_torch.py`): CPU tensors, or backend="torch" anywhere.
`backend="triton"` on CPU tensors runs the Triton kernels under TRITON_INTERPRET=1 (tests do).
The first call of each path logs it (logger "kernels.kda"); `kda_backend(x)` says which path a tensor gets.
Context parallelism over ranks lives in `kernels.kda.cp`.
"""

from __future__ import annotations

import logging
import os

import torch

from kernels.kda.chunk_torch import chunk_kda_torch
from kernels.kda.naive import kda_decode_step, naive_recurrent_kda

try:
    from kernels.kda.chunk_triton import chunk_kda_triton
    from kernels.kda.decode import kda_decode_triton_

    _TRITON_ERROR: ImportError | None = None
except ImportError as err:  # a CPU-only install without triton still gets the torch paths
    _TRITON_ERROR = err

logger = logging.getLogger("kernels.kda")
_LOGGED: set[tuple[str, str, str]] = set()
_BACKENDS = ("triton", "torch")


def kda_backend(x: torch.Tensor, backend: str | None = None) -> str:
    """The path `chunk_kda` takes for tensors like `x`: "triton" on CUDA, "torch" otherwise."""
    if backend is not None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} or None, got {backend!r}")
        path = backend
    else:
        path = "triton" if x.is_cuda else "torch"
    if path == "triton":
        if _TRITON_ERROR is not None:
            raise ValueError(f"the Triton KDA path needs triton, which failed to import ({_TRITON_ERROR}); "
                             "install triton or pass backend='torch'")
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("the Triton KDA path needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU "
                             f"interpreter), got a tensor on {x.device}; pass backend='torch'")
    return path


def _announce(op: str, path: str, x: torch.Tensor) -> None:
    key = (op, path, x.device.type)
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.info("%s: %s path for %s tensors", op, path, x.device.type)


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise KDA (chunk 64): Triton kernels on CUDA tensors, the torch chunked path on the CPU.

    Per head, S_t = (I − β_t k_t k_tᵀ) Diag(e^{g_t}) S_{t−1} + β_t k_t v_tᵀ and o_t = S_tᵀ (scale·q_t),
    computed chunkwise (module docstrings of `chunk_torch.py`, `chunk_triton.py`). Returns (o in q's
    dtype, the fp32 final state or None); differentiable in every input and the initial state.
    """
    path = kda_backend(q, backend)
    _announce("chunk_kda", path, q)
    fn = chunk_kda_triton if path == "triton" else chunk_kda_torch
    return fn(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state)


def kda_decode_step_(
    q_BHK: torch.Tensor,
    k_BHK: torch.Tensor,
    v_BHV: torch.Tensor,
    g_BHK: torch.Tensor,
    beta_BH: torch.Tensor,
    state_BHKV: torch.Tensor,
    scale: float | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """One generation step that updates the fp32 state [B, H, K, V] in place; returns o [B, H, V].

    The Triton kernel on CUDA tensors; on the CPU the reference step, copied into the state.
    """
    path = kda_backend(q_BHK, backend)
    _announce("kda_decode_step_", path, q_BHK)
    if path == "triton":
        return kda_decode_triton_(q_BHK, k_BHK, v_BHV, g_BHK, beta_BH, state_BHKV, scale=scale)
    o, new_state = kda_decode_step(q_BHK, k_BHK, v_BHV, g_BHK, beta_BH, state_BHKV, scale=scale)
    state_BHKV.copy_(new_state)
    return o


__all__ = ["chunk_kda", "chunk_kda_torch", "naive_recurrent_kda", "kda_decode_step", "kda_decode_step_",
           "kda_backend"]
if _TRITON_ERROR is None:
    __all__ += ["chunk_kda_triton"]
