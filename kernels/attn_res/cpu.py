"""Block attention residuals' depth mix on the CPU in C (`attn_res_cpu.c`, built on first use by
`kernels.native`), forward and backward, for k3model/attn_res.py (see the C file for the equations).

    h = Σ_i α_i v_i,   α = softmax_i(r_i · v_i·q),   r_i = rsqrt(mean(v_i²) + ε),   q = γ ⊙ w

In torch the mix is ~25 elementwise passes and reductions over the [B, T, D] sources with their
backwards (4.6 / 6.1 ms forward + backward at N = 2 / 3 sources of [32, 64, 128] on one thread, ~8 %
of the tiny CPU step over its eight mixers; issue 17, docs/log/tiny.md); here one pass each way.
The same mathematics up to fp32 rounding; q's gradient is summed over the tokens in double (the
torch path's pairwise sum was chosen for the same reason, k3model/attn_res.py).

`attn_res_backend(sources)` says which path a list of sources gets: "c" for ≥ 2 fp32 CPU tensors of
one shape with D a multiple of 8 (eager islands inside torch.compile'd code), else "torch" — also with
`K3_CPU_KERNELS=torch` or without a working C compiler (logged as a warning with the reason, once);
`K3_CPU_KERNELS=c` makes a failed build raise.

Legend: N sources, M = B·T tokens, D width.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from kernels import native

logger = logging.getLogger("kernels.attn_res")
_LOGGED: set[str] = set()

SOURCE = Path(__file__).with_name("attn_res_cpu.c")
LANES = 8  # floats per vector along D (D a multiple)
MAX_SOURCES = 64  # NMAX in the C file
_P, _I, _F = native.PTR, native.I64, native.F32
_SIGNATURES = {
    "attn_res_forward": [_P] * 6 + [_I] * 3 + [_F],
    "attn_res_backward": [_P] * 8 + [_I] * 3,
}


def load():
    """The built library, or None when it cannot be built: `load_error()` says why."""
    return native.load(SOURCE, _SIGNATURES)


def load_error() -> str | None:
    return native.load_error(SOURCE)


def _announce(path: str, why: str = "", level: int = logging.INFO) -> None:
    if path not in _LOGGED:
        _LOGGED.add(path)
        logger.log(level, "attn_res: %s path%s", path, f" ({why})" if why else "")


def attn_res_backend(sources: list[torch.Tensor]) -> str:
    """"c" or "torch": the path for these sources (module docstring)."""
    first = sources[0]
    if (native.choice() == "torch" or not 2 <= len(sources) <= MAX_SOURCES or first.device.type != "cpu"
            or first.shape[-1] % LANES or first.numel() == 0
            or any(v.dtype != torch.float32 or v.shape != first.shape for v in sources)):
        return "torch"
    if load() is None:
        _announce("torch", native.build_failed("AttnRes", load_error()), logging.WARNING)
        return "torch"
    _announce("c")
    return "c"


def _pointers(tensors) -> torch.Tensor:
    """An int64 array of the tensors' data pointers (the C side's `float *const *`)."""
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)


class _AttnResFunction(torch.autograd.Function):
    """h = Σ_i α_i v_i on contiguous fp32 CPU sources of one shape [..., D]; q [D] fp32."""

    @staticmethod
    def forward(ctx, q_D, eps: float, *sources):
        N, D = len(sources), q_D.shape[0]
        M = sources[0].numel() // D
        h = torch.empty_like(sources[0])
        alpha_MN, r_MN, dot_MN = (torch.empty(M, N) for _ in range(3))
        src_ptrs = _pointers(sources)
        load().attn_res_forward(src_ptrs.data_ptr(), q_D.data_ptr(), h.data_ptr(), alpha_MN.data_ptr(),
                                r_MN.data_ptr(), dot_MN.data_ptr(), N, M, D, eps)
        ctx.save_for_backward(q_D, alpha_MN, r_MN, dot_MN, *sources)
        return h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dh):
        q_D, alpha_MN, r_MN, dot_MN, *sources = ctx.saved_tensors
        N, D = len(sources), q_D.shape[0]
        M = sources[0].numel() // D
        dh = dh.float().contiguous()
        dsources = [torch.empty_like(v) for v in sources]
        dq = torch.zeros(D, dtype=torch.float64)
        # The pointer arrays held in names: a temporary's memory would be freed before the call.
        src_ptrs, dsrc_ptrs = _pointers(sources), _pointers(dsources)
        load().attn_res_backward(src_ptrs.data_ptr(), q_D.data_ptr(), alpha_MN.data_ptr(), r_MN.data_ptr(),
                                 dot_MN.data_ptr(), dh.data_ptr(), dsrc_ptrs.data_ptr(), dq.data_ptr(), N, M, D)
        return (dq.float(), None, *dsources)


def attn_res_cpu(sources: list[torch.Tensor], query_D: torch.Tensor, key_weight_D: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """Σ_i α_i v_i by the C kernel (`attn_res_backend(sources) == "c"`), in the sources' shape,
    differentiable in every source, the pseudo-query and the key norm's weight."""
    q_D = (key_weight_D.float() * query_D.float()).contiguous()
    return _AttnResFunction.apply(q_D, float(eps), *(v.contiguous() for v in sources))
