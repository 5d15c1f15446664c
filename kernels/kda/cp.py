"""Context parallelism for KDA: one long sequence split into contiguous segments, one per rank.

Every KDA token step is affine in the state, so a segment acts on the state entering it as
(research/kda.md §5; the K3 report's "transition matrix and zero-start state"):

    S_out = M S_in + Z        M = Π_t (I − β_t k_t k_tᵀ) Diag(e^{g_t})  (K×K),  Z = the segment run from S = 0

Forward, per rank r:
1. From its own segment only, [M_r | Z_r] (K×(K+V) per head, fp32) is the final state of the local
   chunked KDA run on values [0 | v] from the initial state [I | 0]: the first K value columns
   carry the identity through the segment's transition, the last V columns the zero-start state.
2. One all-gather of these fixed-size summaries.
3. A scan over the earlier ranks rebuilds the true initial state: S ← M_j S + Z_j for j < r.
4. The local chunked KDA from that state gives the rank's outputs.
Backward, mirrored in reverse: D_r = ∂L/∂S_in from the rank's own outputs (with no gradient on its
final state), one all-gather of the D's, then dS_out,r = fold over later ranks j = R−1 … r+1 of
X ← M_jᵀ X + D_j, and the local backward with that final-state gradient gives the input gradients.
What a rank sends per collective is B·H·K·(K+V) fp32 forward and B·H·K·V backward: independent of T.

The short causal convolution on q, k, v needs the last (W−1) inputs of the previous rank:
`causal_conv1d_cp` exchanges that halo (and its gradient, in reverse) with one all-gather each way.
torch.distributed with gloo on the CPU, NCCL on the GPU; the local KDA goes through
`kernels.kda.chunk_kda` (Triton on CUDA tensors, torch on the CPU).
Legend: B batch, T_r tokens on this rank, H heads, K key width, V value width, C channels, W conv width.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

_BYTES_SENT = {"kda_forward": 0, "kda_backward": 0, "conv_forward": 0, "conv_backward": 0}


def bytes_sent() -> dict[str, int]:
    """Bytes this process has handed to collectives since the last reset, by exchange."""
    return dict(_BYTES_SENT)


def reset_bytes_sent() -> None:
    for key in _BYTES_SENT:
        _BYTES_SENT[key] = 0


def _all_gather(x: torch.Tensor, group, tag: str) -> list[torch.Tensor]:
    x = x.contiguous()
    _BYTES_SENT[tag] += x.numel() * x.element_size()
    out = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, x, group=group)
    return out


def _rank(group) -> int:
    return dist.get_rank(group)


def segment_transition(q, k, v, g, beta, scale=None) -> torch.Tensor:
    """[M | Z] of one segment, [B, H, K, K+V] fp32: S_out = M S_in + Z for any entering state S_in."""
    from kernels.kda import chunk_kda

    B, T, H, K = q.shape
    V = v.shape[-1]
    v_aug = torch.cat([v.new_zeros(B, T, H, K), v], dim=-1)
    eye = torch.eye(K, device=q.device, dtype=torch.float32).expand(B, H, K, K)
    h_aug = torch.cat([eye, q.new_zeros(B, H, K, V, dtype=torch.float32)], dim=-1)
    _, summary = chunk_kda(q, k, v_aug, g, beta, scale=scale, initial_state=h_aug, output_final_state=True)
    return summary


class _ChunkKDAContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, group):
        from kernels.kda import chunk_kda

        K = q.shape[-1]
        summaries = _all_gather(segment_transition(q, k, v, g, beta, scale), group, "kda_forward")
        rank = _rank(group)
        S_in = torch.zeros_like(summaries[0][..., K:])
        for j in range(rank):
            S_in = summaries[j][..., :K] @ S_in + summaries[j][..., K:]
        o, _ = chunk_kda(q, k, v, g, beta, scale=scale, initial_state=S_in)
        ctx.save_for_backward(q, k, v, g, beta, S_in, *[s[..., :K] for s in summaries])
        ctx.scale, ctx.group = scale, group
        return o

    @staticmethod
    def backward(ctx, do):
        from kernels.kda import chunk_kda

        q, k, v, g, beta, S_in, *Ms = ctx.saved_tensors
        rank, world = _rank(ctx.group), len(Ms)
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v, g, beta, S_in)]
            o, S_out = chunk_kda(*leaves[:5], scale=ctx.scale, initial_state=leaves[5], output_final_state=True)
            (D,) = torch.autograd.grad(o, leaves[5], do, retain_graph=True)
            Ds = _all_gather(D, ctx.group, "kda_backward")
            dS_out = torch.zeros_like(D)
            for j in range(world - 1, rank, -1):
                dS_out = Ms[j].transpose(-1, -2) @ dS_out + Ds[j]
            grads = torch.autograd.grad((o, S_out), leaves[:5], (do, dS_out))
        return (*grads, None, None)


def chunk_kda_cp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """KDA over a sequence split contiguously across the ranks of `group` (rank order = time order).

    Each rank passes its own segment `[B, T_r, H, ·]` (fla's layout, `chunk_kda`'s conventions) and
    gets its outputs `[B, T_r, H, V]`; outputs and gradients equal the single-process result.
    The sequence starts from a zero state on rank 0.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("chunk_kda_cp needs an initialized torch.distributed process group; "
                         "call torch.distributed.init_process_group first, or use chunk_kda for one process")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return _ChunkKDAContextParallel.apply(q, k, v, g, beta, scale, group)


def causal_conv1d(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, activation: str | None = "silu",
                  halo_BWC: torch.Tensor | None = None) -> torch.Tensor:
    """Depthwise causal conv over time, y_t = Σ_i w[i] x_{t−W+1+i}, zeros (or `halo_BWC`) before t = 0.

    `weight_C1W` is `[C, 1, W]` as in `k3model.common.ShortConv`; activation "silu" or None.
    """
    W = weight_C1W.shape[-1]
    B, T, C = x_BTC.shape
    if halo_BWC is None:
        halo_BWC = x_BTC.new_zeros(B, W - 1, C)
    padded_BCT = torch.cat([halo_BWC, x_BTC], dim=1).transpose(1, 2)
    y = F.conv1d(padded_BCT, weight_C1W.to(x_BTC.dtype), groups=C).transpose(1, 2)
    if activation == "silu":
        return F.silu(y)
    if activation is None:
        return y
    raise ValueError(f"activation must be 'silu' or None, got {activation!r}")


class _CausalConv1dCP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, activation, group):
        W = weight.shape[-1]
        if x.shape[1] < W - 1:
            raise ValueError(f"each rank needs at least W−1 = {W - 1} tokens for the conv halo, got {x.shape[1]}")
        rank = _rank(group)
        tails = _all_gather(x[:, x.shape[1] - (W - 1):], group, "conv_forward")
        halo = tails[rank - 1] if rank > 0 else torch.zeros_like(tails[0])
        ctx.save_for_backward(x, weight, halo)
        ctx.activation, ctx.group = activation, group
        return causal_conv1d(x, weight, activation, halo)

    @staticmethod
    def backward(ctx, dy):
        x, weight, halo = ctx.saved_tensors
        W = weight.shape[-1]
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in (x, weight, halo)]
            y = causal_conv1d(leaves[0], leaves[1], ctx.activation, leaves[2])
            dx, dw, dhalo = torch.autograd.grad(y, leaves, dy)
        # The halo was the previous rank's tail: its gradient goes back there.
        dhalos = _all_gather(dhalo, ctx.group, "conv_backward")
        rank = _rank(ctx.group)
        if rank + 1 < len(dhalos):
            dx = dx.clone()
            dx[:, dx.shape[1] - (W - 1):] += dhalos[rank + 1]
        return dx, dw, None, None


def causal_conv1d_cp(x_BTC: torch.Tensor, weight_C1W: torch.Tensor, activation: str | None = "silu",
                     group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """`causal_conv1d` over a sequence split contiguously across ranks: each rank receives the last
    W−1 inputs of the previous rank as its left halo (rank 0 gets zeros). The weight gradient is
    this rank's share; sum it over ranks as for any data-parallel parameter."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("causal_conv1d_cp needs an initialized torch.distributed process group")
    return _CausalConv1dCP.apply(x_BTC, weight_C1W, activation, group)
