"""KDA on the CPU by its token recurrence in C (`recurrent_cpu.c`, built on first use by
`kernels.native`), forward and backward, beside the chunked torch path (`chunk_torch.py`).

The recurrence (naive.py) is the same mathematics as the chunked form: at the tiny profile's head
width (K = V = 32) it is also less arithmetic — ~4·K·V multiply-adds per token and head forward
against the chunked form's 64×64 score blocks, their exponent factors, the triangular solve and
~1,500 small torch operations per layer (forward and backward) that dominated the CPU step's KDA
time (issue 17, docs/log/tiny.md). The forward keeps the state every `CHECKPOINT` tokens; the
backward recomputes each stretch from it. Rows (b, h) are split across `torch.get_num_threads()`
threads (ctypes releases the GIL); each row's numbers never depend on the batch or the split.

`kda_cpu(q, k, v, g, beta, scale, initial_state, output_final_state)` has `chunk_kda`'s signature.
Paths, by the tensors, never switched silently:
- "c": fp32 CPU tensors with K a multiple of 8, V a multiple of 16 up to 256 and T ≥ 1 (eager
  islands inside torch.compile'd code).
- "torch" (`chunk_kda_torch`): everything else, `K3_CPU_KERNELS=torch`, or no working C compiler
  (logged as a warning with the reason, once). `K3_CPU_KERNELS=c` makes a failed build raise.
The first call of each path logs it (logger "kernels.kda"); `kda_cpu_backend(q)` says which path a
tensor gets. The two agree to fp32 rounding (tests/kernels/kda/test_cpu.py).

Legend: B batch, T tokens, H heads, K key width, V value width.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from kernels import native
from kernels.kda.chunk_torch import chunk_kda_torch
from kernels.kda.naive import check_kda_inputs

logger = logging.getLogger("kernels.kda")
_LOGGED: set[str] = set()

SOURCE = Path(__file__).with_name("recurrent_cpu.c")
GATES_SOURCE = Path(__file__).with_name("output_gate_cpu.c")
L2_NORM_SOURCE = Path(__file__).with_name("l2_norm_cpu.c")
LANES = 8  # floats per vector along K in the C kernels (K a multiple)
V_LANES = 16  # floats per vector along V in the recurrence (V a multiple)
MAX_V = 256  # the recurrence keeps its per-token V-vectors in fixed arrays (VMAX in the C file)
CHECKPOINT = 32  # tokens between saved states: the backward's recomputed stretch fits in L2 (33 × K·V floats)
_P, _I, _F = native.PTR, native.I64, native.F32
_SIGNATURES = {
    "kda_recurrent_forward": [_P] * 9 + [_I] * 5 + [_F] + [_I] * 3,
    "kda_recurrent_backward": [_P] * 14 + [_I] * 5 + [_F] + [_I] * 3,
}
_GATES_SIGNATURES = {
    "kda_output_gate_forward": [_P] * 4 + [_I] * 2 + [_F],
    "kda_output_gate_backward": [_P] * 7 + [_I] * 2 + [_F],
}
_L2_NORM_SIGNATURES = {
    "kda_l2_norm_forward": [_P] * 2 + [_I] * 2 + [_F],
    "kda_l2_norm_backward": [_P] * 4 + [_I] * 2 + [_F],
}
_POOL: ThreadPoolExecutor | None = None


def load():
    """The built recurrence library, or None when it cannot be built: `load_error()` says why."""
    return native.load(SOURCE, _SIGNATURES)


def load_error() -> str | None:
    return native.load_error(SOURCE)


def load_gates():
    """The built output-gate library (`output_gate_cpu.c`), or None when it cannot be built."""
    return native.load(GATES_SOURCE, _GATES_SIGNATURES)


def load_l2_norm():
    """The built q/k-norm and decay-gate library (`l2_norm_cpu.c`), or None when it cannot be built."""
    return native.load(L2_NORM_SOURCE, _L2_NORM_SIGNATURES)


def _announce(path: str, why: str = "", level: int = logging.INFO) -> None:
    if path not in _LOGGED:
        _LOGGED.add(path)
        logger.log(level, "kda_cpu: %s path%s", path, f" ({why})" if why else "")


# Inside torch.compile'd code the C paths and their dispatch run as eager islands, marked by
# k3model.compiled.mark_eager_islands (not decorated here: torch.compiler.disable imports Dynamo, ~2.5 s
# of every process that imports the model, where most never compile).
def kda_cpu_backend(q: torch.Tensor, v: torch.Tensor | None = None) -> str:
    """"c" or "torch": the path `kda_cpu` takes for tensors like these (module docstring)."""
    choice = native.choice()
    V = q.shape[-1] if v is None else v.shape[-1]
    if (choice == "torch" or q.device.type != "cpu" or q.dtype != torch.float32 or q.shape[-1] % LANES
            or V % V_LANES or V > MAX_V or q.shape[1] == 0):
        return "torch"
    if load() is None or load_gates() is None or load_l2_norm() is None:
        error = load_error() or native.load_error(GATES_SOURCE) or native.load_error(L2_NORM_SOURCE)
        _announce("torch", native.build_failed("KDA", error), logging.WARNING)
        return "torch"
    return "c"


def _run_split(fn, rows: int, *args) -> None:
    """fn(*args, bh0, bh1) over [0, rows), in one contiguous range per thread."""
    global _POOL
    n = max(1, min(torch.get_num_threads(), rows))
    if n == 1:
        fn(*args, 0, rows)
        return
    if _POOL is None or _POOL._max_workers < n:
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="kda_cpu")
    bounds = [rows * i // n for i in range(n + 1)]
    for f in [_POOL.submit(fn, *args, lo, hi) for lo, hi in zip(bounds, bounds[1:])]:
        f.result()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class _KDARecurrentFunction(torch.autograd.Function):
    """(o, final state) of the recurrence on contiguous fp32 CPU tensors; s0 may be None."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, s0, scale: float):
        B, T, H, K = q.shape
        V = v.shape[-1]
        o = torch.empty(B, T, H, V)
        s_final = torch.empty(B, H, K, V)
        grads = any(ctx.needs_input_grad[:6])
        n_ckpt = -(-T // CHECKPOINT)
        ckpt = torch.empty(B * H, n_ckpt, K, V) if grads else None
        _run_split(load().kda_recurrent_forward, B * H, q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(),
                   beta.data_ptr(), _ptr(s0), o.data_ptr(), s_final.data_ptr(), _ptr(ckpt),
                   B, T, H, K, V, scale, CHECKPOINT)
        if grads:
            ctx.save_for_backward(q, k, v, g, beta, ckpt)
            ctx.scale, ctx.has_s0 = scale, s0 is not None
        return o, s_final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, ds_final):
        q, k, v, g, beta, ckpt = ctx.saved_tensors
        B, T, H, K = q.shape
        V = v.shape[-1]
        do = do.float().contiguous()
        ds_final = ds_final.float().contiguous()
        dq, dk, dg, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(g), torch.empty_like(v)
        dbeta = torch.empty_like(beta)
        ds0 = torch.empty(B, H, K, V) if ctx.has_s0 else None
        _run_split(load().kda_recurrent_backward, B * H, q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(),
                   beta.data_ptr(), ckpt.data_ptr(), do.data_ptr(), ds_final.data_ptr(), dq.data_ptr(),
                   dk.data_ptr(), dv.data_ptr(), dg.data_ptr(), dbeta.data_ptr(), _ptr(ds0),
                   B, T, H, K, V, ctx.scale, CHECKPOINT)
        return dq, dk, dv, dg, dbeta, ds0, None


def kda_recurrent_cpu(q, k, v, g, beta, scale: float | None = None, initial_state: torch.Tensor | None = None,
                      output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA by the C kernel (`load()` must have succeeded; fp32, K a multiple of LANES, V of V_LANES):
    (o [B, T, H, V], the fp32 final state or None); differentiable in every input and the initial state."""
    check_kda_inputs(q, k, v, g, beta, initial_state)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s0 = None if initial_state is None else initial_state.float().contiguous()
    o, s_final = _KDARecurrentFunction.apply(q.contiguous(), k.contiguous(), v.float().contiguous(),
                                             g.float().contiguous(), beta.float().contiguous(), s0, float(scale))
    return o, (s_final if output_final_state else None)


def kda_cpu(q, k, v, g, beta, scale: float | None = None, initial_state: torch.Tensor | None = None,
            output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA on CPU tensors with `chunk_kda`'s signature: the C recurrence where it applies, else the
    chunked torch path (module docstring). Returns (o in q's dtype, the fp32 final state or None)."""
    path = kda_cpu_backend(q, v)
    _announce(path)
    fn = kda_recurrent_cpu if path == "c" else chunk_kda_torch
    return fn(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state)


class _KDAOutputGateFunction(torch.autograd.Function):
    """y = σ(c) ⊙ RMSNorm_γ(o) per head row, on contiguous fp32 CPU [B, T, H, K]."""

    @staticmethod
    def forward(ctx, o, c, gamma, eps: float):
        K = o.shape[-1]
        gamma_f = gamma.detach().float().contiguous()
        y = torch.empty_like(o)
        load_gates().kda_output_gate_forward(o.data_ptr(), c.data_ptr(), gamma_f.data_ptr(), y.data_ptr(),
                                             o.numel() // K, K, eps)
        ctx.save_for_backward(o, c, gamma_f)
        ctx.eps, ctx.gamma_dtype = eps, gamma.dtype
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        o, c, gamma_f = ctx.saved_tensors
        K = o.shape[-1]
        dy = dy.float().contiguous()
        do, dc = torch.empty_like(o), torch.empty_like(c)
        dgamma = torch.zeros(K, dtype=torch.float64)
        load_gates().kda_output_gate_backward(o.data_ptr(), c.data_ptr(), gamma_f.data_ptr(), dy.data_ptr(),
                                              do.data_ptr(), dc.data_ptr(), dgamma.data_ptr(), o.numel() // K, K,
                                              ctx.eps)
        return do, dc, dgamma.to(ctx.gamma_dtype), None


def kda_output_gate_cpu(o_BTHK, gate_logits_BTHK, weight_K, eps: float):
    """σ(gate logits) ⊙ RMSNorm(o) (weight γ, over each head's K channels) by the C kernel
    (`kda_cpu_backend` "c"): the KDA layer's gated output before W_o, [B, T, H, K] fp32,
    differentiable in o, the logits and γ."""
    return _KDAOutputGateFunction.apply(o_BTHK.float().contiguous(), gate_logits_BTHK.float().contiguous(),
                                        weight_K, float(eps))


class _L2NormFunction(torch.autograd.Function):
    """x / max(‖x‖, ε) over the last dimension of a contiguous fp32 CPU tensor."""

    @staticmethod
    def forward(ctx, x, eps: float):
        K = x.shape[-1]
        y = torch.empty_like(x)
        load_l2_norm().kda_l2_norm_forward(x.data_ptr(), y.data_ptr(), x.numel() // K, K, eps)
        ctx.save_for_backward(x, y)
        ctx.eps = eps
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        K = x.shape[-1]
        dy = dy.float().contiguous()
        dx = torch.empty_like(x)
        load_l2_norm().kda_l2_norm_backward(x.data_ptr(), y.data_ptr(), dy.data_ptr(), dx.data_ptr(),
                                               x.numel() // K, K, ctx.eps)
        return dx, None


def kda_l2_norm_cpu(x_BTHK: torch.Tensor, eps: float) -> torch.Tensor:
    """F.normalize(x, dim=-1, eps=eps) by the C kernel (`kda_cpu_backend` "c"), fp32, differentiable."""
    return _L2NormFunction.apply(x_BTHK.float().contiguous(), float(eps))

