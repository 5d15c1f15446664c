"""KDA's short convolution + SiLU, optionally followed by the per-head L2 norm of q and k, in Triton
(Kimi Linear §4), for training and prefill from zeros on CUDA, in the [B, T, C] layout (C contiguous):

    p[b, t, c] = Σ_{j<W} w[c, j] · x[b, t + j − (W − 1), c]        x = 0 before t = 0 (no state)
    u = SiLU(p) = p · σ(p)
    y = u                                          head_dim = 0
    y = u · rsqrt(max(Σ_{c ∈ head} u², eps²))      head_dim > 0 (kda_layer's `_l2_normalize`)

computed in fp32, y in x's dtype. Backward, per row and head (n = y, r = rsqrt(max(Σu², eps²))):

    du   = r · (dy − n (n · dy))      (the projection only where Σu² ≥ eps², as autograd of the clamp)
    dp   = du · σ(p) (1 + p (1 − σ(p)))
    dx[t]    = Σ_{j<W} w[c, j] · dp[t + (W − 1) − j]       dp = 0 past the sequence's end
    dw[c, j] = Σ_{b,t} dp[b, t, c] · x[b, t + j − (W − 1), c]

Forward: one pass, each program a tile of rows × one head (or 128 channels): x read once (its W
shifted row loads hit cache), y written once. Backward: two kernels, one tile per program: dp (the
pre-activation again, then the norm's and the SiLU's backward) into an fp32 buffer, then dx from dp's
W shifted rows and each tile's dw as fp32 partial sums, summed on the host: faster on the H200 than
shifting dp inside one kernel's tile (docs/log/gpu.md). Rows are the flattened B·T rows; a row's
t = row mod T masks the sequence boundaries. Addresses: one int64 base per tile and int32 offsets in
it, with the width C a compile-time constant (one compile per width), so that the W shifted loads
share one offset tensor and differ by constants, which keeps the registers a thread needs low
(`probes-archive:benchmarks/probes/kernel_registers.py` reads them from ptxas for sm_90).

`short_conv_silu_triton(x_BTC, weight_C1W, head_dim=0, eps=1e-6) -> y_BTC` is the public function:
the custom op `k3::short_conv_silu` with autograd (x and the weight), usable inside torch.compile
regions without a graph break. CPU tensors run under TRITON_INTERPRET=1 (the tests do).
Legend: B batch, T tokens, C channels (H heads × head_dim), W taps, N = B·T rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_TAPS = 8
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
FWD_ROWS, FWD_WARPS = 64, 4
# The backward's tiles: 64 rows and 4 warps (the fastest on the H200 of the shapes swept,
# docs/log/gpu.md; to be re-swept for the int32 tile offsets).
BWD_ROWS, BWD_WARPS = 64, 4


@triton.jit
def _load_rows(ptr, r, m_r, o_c, m_c, C: tl.constexpr):
    """ptr[r, o_c] as fp32, zero where masked: ptr at the tile's first row, r the tile's row indices (int32,
    so that the W shifted loads share one offset tensor and differ by a constant)."""
    return tl.load(ptr + r[:, None] * C + o_c[None, :], mask=m_r[:, None] & m_c[None, :], other=0.0).to(tl.float32)


@triton.jit
def _preact(x, w, r, t, m_r, o_c, m_c, C: tl.constexpr, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """p = Σ_j w[c, j] · x[row − (W − 1 − j), c], zero before each sequence's first row (x at the tile)."""
    b_p = tl.zeros([BT, BC], dtype=tl.float32)
    for j in tl.static_range(W):
        b_w = tl.load(w + o_c * W + j, mask=m_c, other=0.0).to(tl.float32)
        b_p += _load_rows(x, r - (W - 1 - j), m_r & (t >= W - 1 - j), o_c, m_c, C) * b_w[None, :]
    return b_p


@triton.jit
def _tile(N, T, BT: tl.constexpr):
    """This program's first row (int64), its rows' indices in the tile (int32), which of them exist, and
    each one's position t in its sequence (int32)."""
    row0 = tl.program_id(0).to(tl.int64) * BT
    r = tl.arange(0, BT)
    return row0, r, r < N - row0, ((row0 % T).to(tl.int32) + r) % T


@triton.jit
def _fwd_kernel(x, w, y, N, T, C: tl.constexpr, eps2, W: tl.constexpr, CB: tl.constexpr, BT: tl.constexpr,
                BC: tl.constexpr, NORM: tl.constexpr):
    row0, r, m_r, t = _tile(N, T, BT)
    o_c = tl.program_id(1) * CB + tl.arange(0, BC)
    m_c = (tl.arange(0, BC) < CB) & (o_c < C)
    b_p = _preact(x + row0 * C, w, r, t, m_r, o_c, m_c, C, W, BT, BC)
    b_u = b_p * tl.sigmoid(b_p)
    if NORM:
        b_u = b_u * tl.rsqrt(tl.maximum(tl.sum(b_u * b_u, 1), eps2))[:, None]
    tl.store(y + row0 * C + r[:, None] * C + o_c[None, :], b_u.to(y.dtype.element_ty),
             mask=m_r[:, None] & m_c[None, :])


@triton.jit
def _bwd_dp_kernel(x, w, dy, dp, N, T, C: tl.constexpr, eps2, W: tl.constexpr, CB: tl.constexpr,
                   BT: tl.constexpr, BC: tl.constexpr, NORM: tl.constexpr):
    """Backward, part 1: dp (fp32) on a tile of rows, from x (the pre-activation again) and dy."""
    row0, r, m_r, t = _tile(N, T, BT)
    o_c = tl.program_id(1) * CB + tl.arange(0, BC)
    m_c = (tl.arange(0, BC) < CB) & (o_c < C)
    b_p = _preact(x + row0 * C, w, r, t, m_r, o_c, m_c, C, W, BT, BC)
    b_sig = tl.sigmoid(b_p)
    b_dy = _load_rows(dy + row0 * C, r, m_r, o_c, m_c, C)
    if NORM:
        b_u = b_p * b_sig
        b_ss = tl.sum(b_u * b_u, 1)[:, None]
        b_r = tl.rsqrt(tl.maximum(b_ss, eps2))
        b_n = b_u * b_r
        b_du = b_r * (b_dy - tl.where(b_ss >= eps2, b_n * tl.sum(b_n * b_dy, 1)[:, None], 0.0))
    else:
        b_du = b_dy
    b_dp = b_du * b_sig * (1.0 + b_p * (1.0 - b_sig))
    tl.store(dp + row0 * C + r[:, None] * C + o_c[None, :], b_dp, mask=m_r[:, None] & m_c[None, :])


@triton.jit
def _bwd_dx_kernel(x, w, dp, dx, dw_part, N, T, C: tl.constexpr, W: tl.constexpr, CB: tl.constexpr,
                   BT: tl.constexpr, BC: tl.constexpr, BW: tl.constexpr):
    """Backward, part 2: dx[t] = Σ_s w[W − 1 − s] · dp[t + s] (zero past the sequence's end) and
    this tile's dw[c, j] = Σ_t dp[t] · x[t + j − (W − 1)] as fp32 partial sums, from the stored dp."""
    row0, r, m_r, t = _tile(N, T, BT)
    o_c = tl.program_id(1) * CB + tl.arange(0, BC)
    m_c = (tl.arange(0, BC) < CB) & (o_c < C)
    o_w = tl.arange(0, BW)
    dp_t, x_t = dp + row0 * C, x + row0 * C
    b_dx = tl.zeros([BT, BC], dtype=tl.float32)
    for s in tl.static_range(W):
        b_w = tl.load(w + o_c * W + (W - 1 - s), mask=m_c, other=0.0).to(tl.float32)
        b_dx += _load_rows(dp_t, r + s, m_r & (t + s < T) & (r + s < N - row0), o_c, m_c, C) * b_w[None, :]
    tl.store(dx + row0 * C + r[:, None] * C + o_c[None, :], b_dx.to(dx.dtype.element_ty),
             mask=m_r[:, None] & m_c[None, :])
    b_dp = _load_rows(dp_t, r, m_r, o_c, m_c, C)
    b_dw = tl.zeros([BW, BC], dtype=tl.float32)
    for j in tl.static_range(W):
        b_x = _load_rows(x_t, r - (W - 1 - j), m_r & (t >= W - 1 - j), o_c, m_c, C)
        b_dw += tl.where(o_w[:, None] == j, tl.sum(b_dp * b_x, 0)[None, :], 0.0)
    tl.store(dw_part + tl.program_id(0).to(tl.int64) * W * C + o_w[:, None] * C + o_c[None, :], b_dw,
             mask=(o_w < W)[:, None] & m_c[None, :])


def check_inputs(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, head_dim: int) -> None:
    """ValueError, saying what to change, for inputs the kernels do not take."""
    if x_BTC.dim() != 3:
        raise ValueError(f"x must be [B, T, C], got shape {tuple(x_BTC.shape)}")
    C = x_BTC.shape[-1]
    if weight_C1W.dim() != 3 or weight_C1W.shape[0] != C or weight_C1W.shape[1] != 1:
        raise ValueError(f"the weight must be [C, 1, W] with C = {C} (a depthwise ShortConv's), "
                         f"got shape {tuple(weight_C1W.shape)}")
    if not 1 <= weight_C1W.shape[-1] <= MAX_TAPS:
        raise ValueError(f"the Triton short conv takes 1 to {MAX_TAPS} taps, got {weight_C1W.shape[-1]}; "
                         "use kernels.short_conv.short_conv_silu_torch for longer kernels")
    if x_BTC.dtype not in DTYPES:
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x_BTC.dtype}")
    if head_dim < 0 or (head_dim and (C % head_dim or head_dim > MAX_HEAD_DIM)):
        raise ValueError(f"head_dim must be 0 (no normalization) or divide C = {C} and be at most "
                         f"{MAX_HEAD_DIM}, got {head_dim}")


def _channel_block(C: int, head_dim: int) -> tuple[int, int]:
    """(channels per program, their power-of-two tile width): one head when normalizing, else 128."""
    block = head_dim if head_dim else min(128, C)
    return block, triton.next_power_of_2(block)


def _forward(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, head_dim: int, eps: float) -> torch.Tensor:
    B, T, C = x_BTC.shape
    W = weight_C1W.shape[-1]
    y_BTC = torch.empty(B, T, C, device=x_BTC.device, dtype=x_BTC.dtype)
    if y_BTC.numel() == 0:
        return y_BTC
    CB, BC = _channel_block(C, head_dim)
    _fwd_kernel[(triton.cdiv(B * T, FWD_ROWS), triton.cdiv(C, CB))](
        x_BTC.contiguous(), weight_C1W.contiguous(), y_BTC, B * T, T, C, eps * eps,
        W=W, CB=CB, BT=FWD_ROWS, BC=BC, NORM=head_dim > 0, num_warps=FWD_WARPS)
    return y_BTC


def _backward(dy_BTC: torch.Tensor, x_BTC: torch.Tensor, weight_C1W: torch.Tensor, head_dim: int, eps: float):
    B, T, C = x_BTC.shape
    W = weight_C1W.shape[-1]
    dx_BTC = torch.empty(B, T, C, device=x_BTC.device, dtype=x_BTC.dtype)
    if dx_BTC.numel() == 0:
        return dx_BTC, torch.zeros_like(weight_C1W, memory_format=torch.contiguous_format)
    CB, BC = _channel_block(C, head_dim)
    n_cb = triton.cdiv(C, CB)
    x_BTC, weight_C1W, dy_BTC = x_BTC.contiguous(), weight_C1W.contiguous(), dy_BTC.contiguous()
    n_tiles = triton.cdiv(B * T, BWD_ROWS)
    dp_BTC = torch.empty(B, T, C, device=x_BTC.device, dtype=torch.float32)
    _bwd_dp_kernel[(n_tiles, n_cb)](
        x_BTC, weight_C1W, dy_BTC, dp_BTC, B * T, T, C, eps * eps,
        W=W, CB=CB, BT=BWD_ROWS, BC=BC, NORM=head_dim > 0, num_warps=BWD_WARPS)
    dw_part = torch.empty(n_tiles, W, C, device=x_BTC.device, dtype=torch.float32)
    _bwd_dx_kernel[(n_tiles, n_cb)](
        x_BTC, weight_C1W, dp_BTC, dx_BTC, dw_part, B * T, T, C,
        W=W, CB=CB, BT=BWD_ROWS, BC=BC, BW=triton.next_power_of_2(W), num_warps=BWD_WARPS)
    dw_C1W = dw_part.sum(0).t().contiguous().view(C, 1, W).to(weight_C1W.dtype)
    return dx_BTC, dw_C1W


@torch.library.custom_op("k3::short_conv_silu", mutates_args=())
def _short_conv_silu_op(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, head_dim: int, eps: float) -> torch.Tensor:
    return _forward(x_BTC, weight_C1W, head_dim, eps)


@_short_conv_silu_op.register_fake
def _(x_BTC, weight_C1W, head_dim, eps):
    return x_BTC.new_empty(x_BTC.shape)


@torch.library.custom_op("k3::short_conv_silu_backward", mutates_args=())
def _short_conv_silu_backward_op(dy_BTC: torch.Tensor, x_BTC: torch.Tensor, weight_C1W: torch.Tensor, head_dim: int,
                                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _backward(dy_BTC, x_BTC, weight_C1W, head_dim, eps)


@_short_conv_silu_backward_op.register_fake
def _(dy_BTC, x_BTC, weight_C1W, head_dim, eps):
    return x_BTC.new_empty(x_BTC.shape), weight_C1W.new_empty(weight_C1W.shape)


def _setup_context(ctx, inputs, output):
    x_BTC, weight_C1W, head_dim, eps = inputs
    ctx.save_for_backward(x_BTC, weight_C1W)
    ctx.head_dim, ctx.eps = head_dim, eps


def _backward_rule(ctx, dy_BTC):
    x_BTC, weight_C1W = ctx.saved_tensors
    dx_BTC, dw_C1W = _short_conv_silu_backward_op(dy_BTC, x_BTC, weight_C1W, ctx.head_dim, ctx.eps)
    return dx_BTC, dw_C1W, None, None


_short_conv_silu_op.register_autograd(_backward_rule, setup_context=_setup_context)


def short_conv_silu_triton(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, head_dim: int = 0,
                           eps: float = 1e-6) -> torch.Tensor:
    """SiLU(causal depthwise conv(x)) [B, T, C] in x's dtype, from zeros (no state), L2-normalized over
    each group of `head_dim` channels unless head_dim is 0; differentiable in x and the weight [C, 1, W]
    (W ≤ 8). The custom op `k3::short_conv_silu` (module docstring)."""
    check_inputs(x_BTC, weight_C1W, head_dim)
    return _short_conv_silu_op(x_BTC, weight_C1W, head_dim, float(eps))
