"""Block attention residuals' depth mix in Triton, forward and backward, one pass over the rows each
way, for CUDA sources (k3model/attn_res.py; the CPU has the same maths in C, `attn_res_cpu.c`).

With N = 2..4 sources v_i [M, D] (any mix of fp32, bf16, fp16), the pseudo-query folded into the key
norm's weight, wq = γ ⊙ w (fp32 [D]), and per row, all in fp32:

    r_i = rsqrt(mean(v_i²) + ε),   s_i = v_i · wq,   α = softmax_i(r_i s_i),   h = Σ_i α_i v_i
backward, given dh:
    dα_i = dh · v_i,   dz_i = α_i (dα_i − Σ_j α_j dα_j)
    dv_i = α_i dh + dz_i (r_i wq − s_i r_i³ v_i / D)        (in v_i's dtype)
    dwq  = Σ_rows Σ_i dz_i r_i v_i,   and by autograd of wq = γ ⊙ w:  dw = dwq ⊙ γ,  dγ = dwq ⊙ w

h is stored in the first source's dtype, as the torch path casts it. Each program holds [BLOCK_M,
BLOCK_D] tiles of every source: at D ≤ MAX_BLOCK_D whole rows, so each source is read once each way
and h, dv written once (the bandwidth floor: (N+1) row-reads/writes forward, 2N+1 backward); wider
rows loop over D chunks twice (the row statistics, then the outputs), reading the sources twice.
Inductor's kernels for the same maths read the sources several times and store a stacked fp32 copy.

The backward recomputes r, s and α from the sources it reads anyway (no extra bytes, and the op
keeps one output); what the forward would store ([N, M] fp32 α and r) would only save arithmetic.
Each of its programs loops over BWD_ROWS_PER_PROGRAM rows, so that dwq's per-program partial sums
form a small [P, D] fp32 buffer, summed by torch; every sum is in fp32 in a fixed order (no
atomics: the same bits run to run).

`attn_res_mix_triton(sources, query, key_norm_weight, eps)` is the public function: a
`torch.library` custom op (`k3::attn_res_mix`, backward `k3::attn_res_mix_backward`) with autograd,
so torch.compile keeps it in its graph without a break. Sources are never stacked: each is a kernel
argument of its own (v0..v3, unused slots ignored).
Legend: N sources, M = B·T rows, D width, P backward programs.
"""

from __future__ import annotations

import logging
import os

import torch
import triton
import triton.language as tl

logger = logging.getLogger("kernels.attn_res")
_LOGGED: set[str] = set()

MAX_SOURCES = 4  # pointer slots v0..v3
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# One source's tile is [BLOCK_M, BLOCK_D], BLOCK_M·BLOCK_D = ROW_TILE (or BLOCK_D when wider), with
# 8 values per thread (one 16-byte bf16 vector): at D = 1024, one row and 4 warps — with 4 rows a
# backward program, the fastest measured shape on the H200 (docs/log/gpu.md). Rows wider than
# MAX_BLOCK_D take the loop over D chunks.
ROW_TILE = 1024
MAX_BLOCK_D = 4096
VALUES_PER_THREAD = 8
# Backward: rows per program. Each program writes one fp32 row of dwq partial sums ([M/4, D]); a fixed
# count, not one per SM, so that the sum's order does not depend on the GPU's SM count, and many short
# programs balance the SMs (one row a program writes [M, D] of partial sums and is slower).
BWD_ROWS_PER_PROGRAM = 4
# Software-pipelining stages of the backward's loop over a program's row blocks (1: none).
BWD_STAGES = 1


# ---- kernels ----------------------------------------------------------------------------------------


@triton.jit
def _load(ptr, at, mask):
    return tl.load(ptr + at, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _norm_dot(x, b_wq, D, eps):
    """r = rsqrt(mean(x²) + ε) and s = x · wq, per row of a whole-row tile."""
    return tl.rsqrt(tl.sum(x * x, 1) / D + eps), tl.sum(x * b_wq, 1)


@triton.jit
def _softmax(l0, l1, l2, l3, N: tl.constexpr):
    """α over each row's N logits (l2, l3 are ignored below N = 3, 4)."""
    mx = tl.maximum(l0, l1)
    if N > 2:
        mx = tl.maximum(mx, l2)
    if N > 3:
        mx = tl.maximum(mx, l3)
    e0 = tl.exp(l0 - mx)
    e1 = tl.exp(l1 - mx)
    z = e0 + e1
    e2 = e0
    e3 = e0
    if N > 2:
        e2 = tl.exp(l2 - mx)
        z += e2
    if N > 3:
        e3 = tl.exp(l3 - mx)
        z += e3
    return e0 / z, e1 / z, e2 / z, e3 / z


@triton.jit
def _chunk_sums(v, at, mask, b_wq, g, ss, s, da, USED: tl.constexpr, GRAD: tl.constexpr):
    """Adds one D chunk's Σv², v·wq and (GRAD) dh·v to a source's row sums; unused slots pass through."""
    if USED:
        x = _load(v, at, mask)
        ss += tl.sum(x * x, 1)
        s += tl.sum(x * b_wq, 1)
        if GRAD:
            da += tl.sum(x * g, 1)
    return ss, s, da


@triton.jit
def _source_grad(x, g, b_wq, al, r, s, da, sa, D, dv, at, mask, acc):
    """Stores dv = α dh + dz (r wq − s r³ v / D) for one source's tile; returns acc + dz r v (dwq's terms)."""
    c = al * (da - sa) * r
    k = c * s * r * r / D
    tl.store(dv + at, (al[:, None] * g + c[:, None] * b_wq - k[:, None] * x).to(dv.dtype.element_ty), mask=mask)
    return acc + c[:, None] * x


@triton.jit
def _chunk_grad(v, dv, at, mask, g, b_wq, al, r, s, da, sa, D, acc, USED: tl.constexpr):
    if USED:
        acc = _source_grad(_load(v, at, mask), g, b_wq, al, r, s, da, sa, D, dv, at, mask, acc)
    return acc


@triton.jit
def _fwd_kernel(v0, v1, v2, v3, wq, h, M, D, eps,
                N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, ONE_CHUNK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_M = rows < M
    row_at = rows.to(tl.int64)[:, None] * D
    cols = tl.arange(0, BLOCK_D)
    if ONE_CHUNK:
        m_D = cols < D
        at = row_at + cols[None, :]
        m = m_M[:, None] & m_D[None, :]
        b_wq = tl.load(wq + cols, mask=m_D, other=0.0)[None, :]
        x0 = _load(v0, at, m)
        x1 = _load(v1, at, m)
        r0, s0 = _norm_dot(x0, b_wq, D, eps)
        r1, s1 = _norm_dot(x1, b_wq, D, eps)
        x2, r2, s2, x3, r3, s3 = x0, r0, s0, x0, r0, s0
        if N > 2:
            x2 = _load(v2, at, m)
            r2, s2 = _norm_dot(x2, b_wq, D, eps)
        if N > 3:
            x3 = _load(v3, at, m)
            r3, s3 = _norm_dot(x3, b_wq, D, eps)
        al0, al1, al2, al3 = _softmax(r0 * s0, r1 * s1, r2 * s2, r3 * s3, N)
        acc = al0[:, None] * x0 + al1[:, None] * x1
        if N > 2:
            acc += al2[:, None] * x2
        if N > 3:
            acc += al3[:, None] * x3
        tl.store(h + at, acc.to(h.dtype.element_ty), mask=m)
    else:
        ss0 = tl.zeros([BLOCK_M], tl.float32)
        ss1, ss2, ss3, s0, s1, s2, s3 = ss0, ss0, ss0, ss0, ss0, ss0, ss0
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            m_D = c < D
            at = row_at + c[None, :]
            m = m_M[:, None] & m_D[None, :]
            b_wq = tl.load(wq + c, mask=m_D, other=0.0)[None, :]
            ss0, s0, _ = _chunk_sums(v0, at, m, b_wq, b_wq, ss0, s0, s0, True, False)
            ss1, s1, _ = _chunk_sums(v1, at, m, b_wq, b_wq, ss1, s1, s1, True, False)
            ss2, s2, _ = _chunk_sums(v2, at, m, b_wq, b_wq, ss2, s2, s2, N > 2, False)
            ss3, s3, _ = _chunk_sums(v3, at, m, b_wq, b_wq, ss3, s3, s3, N > 3, False)
        al0, al1, al2, al3 = _softmax(tl.rsqrt(ss0 / D + eps) * s0, tl.rsqrt(ss1 / D + eps) * s1,
                                      tl.rsqrt(ss2 / D + eps) * s2, tl.rsqrt(ss3 / D + eps) * s3, N)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            at = row_at + c[None, :]
            m = m_M[:, None] & (c < D)[None, :]
            acc = al0[:, None] * _load(v0, at, m) + al1[:, None] * _load(v1, at, m)
            if N > 2:
                acc += al2[:, None] * _load(v2, at, m)
            if N > 3:
                acc += al3[:, None] * _load(v3, at, m)
            tl.store(h + at, acc.to(h.dtype.element_ty), mask=m)


@triton.jit
def _bwd_kernel(v0, v1, v2, v3, dv0, dv1, dv2, dv3, wq, dh, dwq_part, M, D, eps, n_blocks, blocks_per_program,
                N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, ONE_CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    first = pid * blocks_per_program
    last = tl.minimum(first + blocks_per_program, n_blocks)
    cols = tl.arange(0, BLOCK_D)
    if ONE_CHUNK:
        m_D = cols < D
        b_wq = tl.load(wq + cols, mask=m_D, other=0.0)[None, :]
        # dwq's terms over this program's rows, reduced over the rows once at the end
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for blk in range(first, last):
            rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
            at = rows.to(tl.int64)[:, None] * D + cols[None, :]
            m = (rows < M)[:, None] & m_D[None, :]
            g = _load(dh, at, m)
            x0 = _load(v0, at, m)
            x1 = _load(v1, at, m)
            r0, s0 = _norm_dot(x0, b_wq, D, eps)
            r1, s1 = _norm_dot(x1, b_wq, D, eps)
            da0 = tl.sum(x0 * g, 1)
            da1 = tl.sum(x1 * g, 1)
            x2, r2, s2, da2, x3, r3, s3, da3 = x0, r0, s0, da0, x0, r0, s0, da0
            if N > 2:
                x2 = _load(v2, at, m)
                r2, s2 = _norm_dot(x2, b_wq, D, eps)
                da2 = tl.sum(x2 * g, 1)
            if N > 3:
                x3 = _load(v3, at, m)
                r3, s3 = _norm_dot(x3, b_wq, D, eps)
                da3 = tl.sum(x3 * g, 1)
            al0, al1, al2, al3 = _softmax(r0 * s0, r1 * s1, r2 * s2, r3 * s3, N)
            sa = al0 * da0 + al1 * da1
            if N > 2:
                sa += al2 * da2
            if N > 3:
                sa += al3 * da3
            acc = _source_grad(x0, g, b_wq, al0, r0, s0, da0, sa, D, dv0, at, m, acc)
            acc = _source_grad(x1, g, b_wq, al1, r1, s1, da1, sa, D, dv1, at, m, acc)
            if N > 2:
                acc = _source_grad(x2, g, b_wq, al2, r2, s2, da2, sa, D, dv2, at, m, acc)
            if N > 3:
                acc = _source_grad(x3, g, b_wq, al3, r3, s3, da3, sa, D, dv3, at, m, acc)
        tl.store(dwq_part + pid * D + cols, tl.sum(acc, 0), mask=m_D)
    else:
        # dwq_part starts at zero; each program adds into its own row of it, chunk by chunk
        for blk in range(first, last):
            rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
            m_M = rows < M
            row_at = rows.to(tl.int64)[:, None] * D
            ss0 = tl.zeros([BLOCK_M], tl.float32)
            ss1, ss2, ss3, s0, s1, s2, s3 = ss0, ss0, ss0, ss0, ss0, ss0, ss0
            da0, da1, da2, da3 = ss0, ss0, ss0, ss0
            for d0 in range(0, D, BLOCK_D):
                c = d0 + cols
                m_D = c < D
                at = row_at + c[None, :]
                m = m_M[:, None] & m_D[None, :]
                b_wq = tl.load(wq + c, mask=m_D, other=0.0)[None, :]
                g = _load(dh, at, m)
                ss0, s0, da0 = _chunk_sums(v0, at, m, b_wq, g, ss0, s0, da0, True, True)
                ss1, s1, da1 = _chunk_sums(v1, at, m, b_wq, g, ss1, s1, da1, True, True)
                ss2, s2, da2 = _chunk_sums(v2, at, m, b_wq, g, ss2, s2, da2, N > 2, True)
                ss3, s3, da3 = _chunk_sums(v3, at, m, b_wq, g, ss3, s3, da3, N > 3, True)
            r0, r1 = tl.rsqrt(ss0 / D + eps), tl.rsqrt(ss1 / D + eps)
            r2, r3 = tl.rsqrt(ss2 / D + eps), tl.rsqrt(ss3 / D + eps)
            al0, al1, al2, al3 = _softmax(r0 * s0, r1 * s1, r2 * s2, r3 * s3, N)
            sa = al0 * da0 + al1 * da1
            if N > 2:
                sa += al2 * da2
            if N > 3:
                sa += al3 * da3
            for d0 in range(0, D, BLOCK_D):
                c = d0 + cols
                m_D = c < D
                at = row_at + c[None, :]
                m = m_M[:, None] & m_D[None, :]
                b_wq = tl.load(wq + c, mask=m_D, other=0.0)[None, :]
                g = _load(dh, at, m)
                acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
                acc = _chunk_grad(v0, dv0, at, m, g, b_wq, al0, r0, s0, da0, sa, D, acc, True)
                acc = _chunk_grad(v1, dv1, at, m, g, b_wq, al1, r1, s1, da1, sa, D, acc, True)
                acc = _chunk_grad(v2, dv2, at, m, g, b_wq, al2, r2, s2, da2, sa, D, acc, N > 2)
                acc = _chunk_grad(v3, dv3, at, m, g, b_wq, al3, r3, s3, da3, sa, D, acc, N > 3)
                part_at = dwq_part + pid * D + c
                tl.store(part_at, tl.load(part_at, mask=m_D, other=0.0) + tl.sum(acc, 0), mask=m_D)


# ---- host forward and backward ----------------------------------------------------------------------


def _tiles(D: int) -> tuple[int, int, bool, int]:
    """(BLOCK_M, BLOCK_D, whole rows in one chunk, warps) for width D."""
    block_d = min(triton.next_power_of_2(D), MAX_BLOCK_D)
    block_m = max(1, ROW_TILE // block_d)
    return block_m, block_d, block_d >= D, max(1, min(16, block_m * block_d // (32 * VALUES_PER_THREAD)))


def _slots(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors in the kernels' four pointer slots; the unused ones get the first (never read)."""
    return list(tensors) + [tensors[0]] * (MAX_SOURCES - len(tensors))


def _check(sources: list[torch.Tensor], wq_D: torch.Tensor) -> None:
    """ValueError, saying what to change, for inputs the kernels do not take."""
    if not 2 <= len(sources) <= MAX_SOURCES:
        raise ValueError(f"the Triton AttnRes mix takes 2 to {MAX_SOURCES} sources, got {len(sources)}; "
                         "mix more in torch (AttnRes._mix_torch)")
    first = sources[0]
    for i, v in enumerate(sources):
        if v.shape != first.shape:
            raise ValueError(f"AttnRes source {i} has shape {tuple(v.shape)} but source 0 {tuple(first.shape)}: "
                             "pass sources of one shape [..., D]")
        if v.device != first.device:
            raise ValueError(f"AttnRes source {i} is on {v.device} but source 0 on {first.device}: "
                             "move them to one device")
        if v.dtype not in DTYPES:
            raise ValueError(f"AttnRes source {i} is {v.dtype}; the Triton mix takes float32, bfloat16 or "
                             "float16 sources: cast it, or mix in torch (AttnRes._mix_torch)")
    if wq_D.dim() != 1 or wq_D.shape[0] != first.shape[-1]:
        raise ValueError(f"the query has shape {tuple(wq_D.shape)} but the sources' width is {first.shape[-1]}: "
                         "pass a query and key norm weight of shape [D]")
    if wq_D.dtype != torch.float32 or wq_D.device != first.device:
        raise ValueError(f"the folded query γ ⊙ w must be float32 on {first.device}, got {wq_D.dtype} on "
                         f"{wq_D.device}: call attn_res_mix_triton, which folds it")


def _check_launchable(x: torch.Tensor) -> None:
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"the Triton AttnRes mix needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU "
                         f"interpreter), got a tensor on {x.device}; use AttnRes's torch or C path")
    if "triton" not in _LOGGED:
        _LOGGED.add("triton")
        logger.info("attn_res: triton path (%s)", x.device.type)


def attn_res_forward(sources: list[torch.Tensor], wq_D: torch.Tensor, eps: float) -> torch.Tensor:
    """h = Σ_i α_i v_i in the first source's dtype and shape (module docstring)."""
    _check(sources, wq_D)
    _check_launchable(sources[0])
    src = [v.contiguous() for v in sources]
    D = wq_D.shape[0]
    M = src[0].numel() // D
    h = torch.empty(src[0].shape, dtype=src[0].dtype, device=src[0].device)
    if M == 0:
        return h
    block_m, block_d, one_chunk, warps = _tiles(D)
    _fwd_kernel[(triton.cdiv(M, block_m),)](
        *_slots(src), wq_D.contiguous(), h, M, D, eps,
        N=len(src), BLOCK_M=block_m, BLOCK_D=block_d, ONE_CHUNK=one_chunk, num_warps=warps)
    return h


def attn_res_backward(dh: torch.Tensor, sources: list[torch.Tensor], wq_D: torch.Tensor,
                      eps: float) -> list[torch.Tensor]:
    """[dv_0, …, dv_{N−1} (each in its source's dtype), dwq (fp32 [D])] for the incoming gradient dh."""
    _check(sources, wq_D)
    _check_launchable(sources[0])
    src = [v.contiguous() for v in sources]
    dh = dh.contiguous()
    D = wq_D.shape[0]
    M = src[0].numel() // D
    dsrc = [torch.empty(v.shape, dtype=v.dtype, device=v.device) for v in src]
    if M == 0:
        return dsrc + [torch.zeros_like(wq_D)]
    block_m, block_d, one_chunk, warps = _tiles(D)
    n_blocks = triton.cdiv(M, block_m)
    blocks_per_program = max(1, BWD_ROWS_PER_PROGRAM // block_m)
    P = triton.cdiv(n_blocks, blocks_per_program)
    # One chunk: each program writes its row once at the end; chunked: programs add into theirs.
    dwq_part_PD = (torch.empty if one_chunk else torch.zeros)(P, D, dtype=torch.float32, device=src[0].device)
    _bwd_kernel[(P,)](
        *_slots(src), *_slots(dsrc), wq_D.contiguous(), dh, dwq_part_PD, M, D, eps, n_blocks, blocks_per_program,
        N=len(src), BLOCK_M=block_m, BLOCK_D=block_d, ONE_CHUNK=one_chunk, num_warps=warps, num_stages=BWD_STAGES)
    return dsrc + [dwq_part_PD.sum(0)]


# ---- custom op with autograd ------------------------------------------------------------------------


@torch.library.custom_op("k3::attn_res_mix", mutates_args=())
def _mix_op(sources: list[torch.Tensor], wq: torch.Tensor, eps: float) -> torch.Tensor:
    return attn_res_forward(sources, wq, eps)


@_mix_op.register_fake
def _mix_fake(sources, wq, eps):
    return sources[0].new_empty(sources[0].shape)


@torch.library.custom_op("k3::attn_res_mix_backward", mutates_args=())
def _mix_backward_op(dh: torch.Tensor, sources: list[torch.Tensor], wq: torch.Tensor,
                     eps: float) -> list[torch.Tensor]:
    return attn_res_backward(dh, sources, wq, eps)


@_mix_backward_op.register_fake
def _mix_backward_fake(dh, sources, wq, eps):
    return [v.new_empty(v.shape) for v in sources] + [wq.new_empty(wq.shape)]


def _setup_context(ctx, inputs, output):
    sources, wq, eps = inputs
    ctx.save_for_backward(*sources, wq)
    ctx.eps = eps


def _mix_autograd(ctx, dh):
    *sources, wq = ctx.saved_tensors
    *dsources, dwq = _mix_backward_op(dh, sources, wq, ctx.eps)
    return dsources, dwq, None


_mix_op.register_autograd(_mix_autograd, setup_context=_setup_context)


def attn_res_mix_triton(sources: list[torch.Tensor], query_D: torch.Tensor, key_weight_D: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """Σ_i α_i v_i over 2–4 CUDA sources of one shape [..., D] (dtypes fp32/bf16/fp16, mixed allowed),
    in the first source's dtype; differentiable in every source, the pseudo-query and the key norm's
    weight (through wq = γ ⊙ w, folded here in torch). Works inside torch.compile without a break."""
    wq_D = key_weight_D.float() * query_D.float()
    _check(sources, wq_D)
    return _mix_op(list(sources), wq_D, float(eps))
