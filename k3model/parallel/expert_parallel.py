"""Expert parallelism for LatentMoE: routed experts sharded over ranks, tokens moved by all-to-all.

Applied from outside the model (DESIGN.md §2, as torchtitan's `parallelize.py`): `k3model/moe.py`
stays single-device and `parallelize_experts(model, group)` swaps each `LatentMoE` of a built model
for an `ExpertParallelMoE` that wraps it.

Setting (DeepSeek-V3 / torchtitan EP inside data parallelism): every rank holds *different* tokens
and the same replicated router, routing bias, latent projections, latent norm and shared experts;
rank r owns the routed experts [r·E/W, (r+1)·E/W). One forward on rank r:

    ids_MK, p_MK = route(x_MD)                       same router and bias on every rank
    z_ML         = W_down x_MD                        replicated projection, local tokens
    counts       all-to-all of the per-expert token counts   (W·E/W int64 per rank)
    z_NL         all-to-all of the rows z_m, one per (token, chosen expert), to each expert's owner
    o_NL         = E_j(z_NL) for the local experts   (rows regrouped by local expert, one matmul each)
    o_RL         all-to-all back (the reverse splits)
    u_ML         = Σ_{j∈I_m} p_mj o_mj;   y_MD = Σ shared S(x_MD) + W_up RMSNorm(u_ML)

The backward of an all-to-all is the all-to-all with the splits swapped (`_AllToAll`), so autograd
carries every gradient: with the global batch the concatenation of the ranks' batches and the loss
L = Σ_r L_r, the local experts' gradients equal the single-device layer's, and the replicated
parameters' gradients are each rank's share, summed over ranks by `reduce_gradients`. For a mean
loss (each rank's L_r a mean over its tokens, the data-parallel convention) call
`reduce_gradients(average=True)`: replicated grads are averaged and the expert grads divided by W,
which is the gradient of (1/W)·Σ_r L_r. `k3model.parallel.data_parallel.allreduce_gradients` does the
same for a whole model, so a training step never calls it per layer.

Balancing uses the global load: `sync_balancing_stats` sums the per-expert loads and margin
histograms over ranks with one all-reduce each (and gathers the raw margins for
`quantile_method="exact"`) before the single-device `LatentMoE.update_bias` runs, so every rank sets
the same bias, equal to the single-device update on the global batch. Calling `moe.update_bias()`
directly in a multi-rank run would use this rank's tokens only and let the biases drift apart.

Collectives: `all_to_all_single` with uneven splits runs on gloo (checked on torch 2.13, CPU) and
on NCCL, so there is one code path; the token counts are exchanged first so every rank can size
its receive buffer. `last_load` and `load_max_over_mean()` of the wrapped layer stay local.

Legend: M local tokens, K top-k, R = M·K (token, expert) rows sent, N rows received, E routed
experts, W ranks, e = E/W local experts, L latent width, H expert hidden, D width.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from k3model.moe import LatentMoE, situ_glu


class _AllToAll(torch.autograd.Function):
    """Rows of `x` go to ranks in blocks of `in_splits`; `out_splits` rows arrive from each rank.

    The backward sends the gradient back the way the rows came: the same call, splits swapped.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits = (out_splits, in_splits)
        ctx.group = group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        out_splits, in_splits = ctx.splits
        return _all_to_all(grad_out, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def all_to_all_rows(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group=None) -> torch.Tensor:
    """Differentiable all-to-all along dim 0: send `in_splits[w]` rows to rank w, receive `out_splits[w]`."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


def expert_range(n_routed: int, rank: int, world: int) -> tuple[int, int]:
    """The [start, stop) of the experts rank `rank` owns; E must divide evenly over the ranks."""
    if n_routed % world:
        raise ValueError(f"expert parallelism splits n_routed = {n_routed} experts evenly over ranks, but "
                         f"{world} ranks do not divide it: use a world size that divides {n_routed}")
    per_rank = n_routed // world
    return rank * per_rank, (rank + 1) * per_rank


@torch.no_grad()
def sync_balancing_stats(moe: LatentMoE, group=None) -> None:
    """Replace `moe`'s balancing statistics by their sums over the ranks of `group` (call on every rank).

    After it, `moe.update_bias()` computes the bias the single-device layer would compute from the
    concatenation of all ranks' training forwards since the last update. Loads and histograms are
    counts, so their sums are exact; for `quantile_method="exact"` the raw margins are gathered
    (padded to the longest rank's rows, then trimmed).
    """
    if moe.freeze_bias or moe.cfg.balancing == "none" or dist.get_world_size(group) == 1:
        return
    # Private statistics of LatentMoE, reached on purpose: its docstring defines the histogram as
    # "summable across ranks by one all-reduce", and the update itself must stay in moe.py.
    dist.all_reduce(moe._load_acc_E, group=group)
    if moe.cfg.balancing != "quantile":
        return
    dist.all_reduce(moe._margin_hist_EX, group=group)
    if moe.quantile_method == "exact":
        E = moe.cfg.n_routed
        device = moe._load_acc_E.device
        local_NE = torch.cat(moe._margins, 0) if moe._margins else torch.zeros(0, E, device=device)
        world = dist.get_world_size(group)
        n_local = torch.tensor([local_NE.shape[0]], device=device)
        sizes = [torch.zeros_like(n_local) for _ in range(world)]
        dist.all_gather(sizes, n_local, group=group)
        sizes = [int(s) for s in sizes]
        padded_NE = torch.zeros(max(sizes), E, device=device, dtype=local_NE.dtype)
        padded_NE[: local_NE.shape[0]] = local_NE
        gathered = [torch.empty_like(padded_NE) for _ in range(world)]
        dist.all_gather(gathered, padded_NE, group=group)
        moe._margins = [g[:n] for g, n in zip(gathered, sizes) if n > 0]


class ExpertParallelMoE(nn.Module):
    """A LatentMoE whose routed experts are sharded over the ranks of `group`; see the module docstring.

    Built from a full single-device `LatentMoE` (the same weights on every rank, e.g. the same seed):
    the wrapped layer keeps its replicated parts, and its three batched expert weights are replaced
    by this rank's slice, `[E/W, …]`, so it holds 1/W of the routed parameters. The wrapped layer's
    own `forward` then no longer applies; call this module.
    """

    def __init__(self, moe: LatentMoE, group=None):
        super().__init__()
        if not dist.is_initialized():
            raise ValueError("ExpertParallelMoE needs torch.distributed initialized "
                             "(dist.init_process_group) before the layer is wrapped")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        E = moe.cfg.n_routed
        self.expert_start, self.expert_stop = expert_range(E, self.rank, self.world)
        self.n_local = self.expert_stop - self.expert_start
        for name in ("w_gate_EHL", "w_up_EHL", "w_down_ELH"):
            full = getattr(moe, name)
            if full.shape[0] != E:
                raise ValueError(f"{name} has {full.shape[0]} experts, expected n_routed = {E}: "
                                 "wrap a full LatentMoE, not one already sharded")
            local = full.detach()[self.expert_start:self.expert_stop].clone()
            setattr(moe, name, nn.Parameter(local, requires_grad=full.requires_grad))
        self.moe = moe

    @property
    def cfg(self):
        return self.moe.cfg

    def expert_parameters(self) -> list[nn.Parameter]:
        """The sharded routed-expert weights (this rank's E/W experts)."""
        return [self.moe.w_gate_EHL, self.moe.w_up_EHL, self.moe.w_down_ELH]

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Router, latent projections and norm, shared experts: the same on every rank."""
        sharded = {id(p) for p in self.expert_parameters()}
        return [p for p in self.moe.parameters() if id(p) not in sharded]

    # ------------------------------------------------------------------------------------------

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        moe = self.moe
        B, T, D = x_BTD.shape
        x_MD = x_BTD.reshape(B * T, D)
        ids_MK, p_MK, cutoff_M, s_ME = moe.route(x_MD)
        moe._observe(ids_MK, cutoff_M, s_ME)

        u_ML = self.routed_experts(moe.latent_down(x_MD), ids_MK, p_MK)
        y_MD = moe.latent_up(moe.latent_norm(u_ML))
        if moe.shared is not None:
            y_MD = y_MD + moe.shared(x_MD)
        return y_MD.reshape(B, T, D)

    def routed_experts(self, z_ML: torch.Tensor, ids_MK: torch.Tensor, p_MK: torch.Tensor) -> torch.Tensor:
        """u_ML = Σ_{j∈I_m} p_mj E_j(z_m), with E_j evaluated on the rank that owns expert j."""
        moe, W, e = self.moe, self.world, self.n_local
        M, K = ids_MK.shape
        E = moe.cfg.n_routed
        # Sorting by global expert id also groups the rows by owning rank (experts are contiguous).
        ids_R = ids_MK.reshape(-1)
        order_R = torch.argsort(ids_R, stable=True)
        token_R = order_R // K
        weight_R1 = p_MK.reshape(-1)[order_R].unsqueeze(-1)
        send_counts_We = torch.bincount(ids_R, minlength=E).view(W, e)
        recv_counts_We = _all_to_all(send_counts_We, [1] * W, [1] * W, self.group)
        # Two host syncs per layer: the splits must be Python ints.
        send_counts, recv_counts = send_counts_We.tolist(), recv_counts_We.tolist()
        send_splits = [sum(row) for row in send_counts]
        recv_splits = [sum(row) for row in recv_counts]
        rows_per_local_expert = [sum(col) for col in zip(*recv_counts)]

        z_RL = moe._expert_act(z_ML.index_select(0, token_R))
        z_NL = all_to_all_rows(z_RL, recv_splits, send_splits, self.group)

        # Rows arrive grouped by source rank, then local expert; regroup by local expert, keeping
        # source-rank order inside each expert (the order the single-device layer sees them in).
        local_id_N = torch.repeat_interleave(torch.arange(e, device=z_NL.device).repeat(W),
                                             recv_counts_We.reshape(-1))
        order_N = torch.argsort(local_id_N, stable=True)
        z_sorted_NL = z_NL.index_select(0, order_N)
        w_gate_eHL, w_up_eHL, w_down_eLH = moe._expert_weights()
        out_chunks = []
        start = 0
        # Experts with no rows still run (on zero rows): every rank then keeps both exchanges in its
        # autograd graph, so the backward all-to-alls are called on all ranks alike.
        for j, n in enumerate(rows_per_local_expert):
            z_nL = z_sorted_NL[start:start + n]
            h_nH = situ_glu(z_nL @ w_gate_eHL[j].t(), z_nL @ w_up_eHL[j].t(), moe.cfg.situ_beta1,
                            moe.cfg.situ_beta2)
            out_chunks.append(moe._expert_act(h_nH) @ w_down_eLH[j].t())
            start += n
        out_sorted_NL = torch.cat(out_chunks, 0)
        out_NL = torch.empty_like(out_sorted_NL).index_copy(0, order_N, out_sorted_NL)
        out_RL = all_to_all_rows(out_NL, send_splits, recv_splits, self.group)

        u_ML = torch.zeros(M, z_ML.shape[-1], dtype=torch.float32, device=z_ML.device)
        u_ML = u_ML.index_add(0, token_R, out_RL.float() * weight_R1)
        return u_ML.to(z_ML.dtype)

    # ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def reduce_gradients(self, average: bool = True) -> None:
        """All-reduce the replicated parameters' gradients over the group (sum, or mean if `average`).

        With `average` the expert gradients are divided by W as well, so every gradient is that of
        (1/W)·Σ_r L_r. Call on every rank after backward; missing gradients count as zero.
        """
        for p in self.replicated_parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=self.group)
            if average:
                p.grad.div_(self.world)
        if average:
            for p in self.expert_parameters():
                if p.grad is not None:
                    p.grad.div_(self.world)

    def update_bias(self) -> None:
        """The single-device bias update on the statistics summed over all ranks (call on every rank)."""
        sync_balancing_stats(self.moe, self.group)
        self.moe.update_bias()


def parallelize_moe(moe: LatentMoE, group=None) -> ExpertParallelMoE:
    """Shard `moe`'s routed experts over `group`; the returned module replaces it in the model."""
    return ExpertParallelMoE(moe, group)


def parallelize_experts(model: nn.Module, group=None) -> list[ExpertParallelMoE]:
    """Replace every LatentMoE child of `model` by an ExpertParallelMoE, in place; returns them.

    Weights must already be equal on all ranks (same seed, or a broadcast) since each rank keeps its
    slice of its own copy.
    """
    wrapped = []
    for parent in list(model.modules()):
        if isinstance(parent, ExpertParallelMoE):
            continue
        for name, child in list(parent.named_children()):
            if isinstance(child, LatentMoE):
                ep = ExpertParallelMoE(child, group)
                setattr(parent, name, ep)
                wrapped.append(ep)
    if not wrapped:
        raise ValueError("parallelize_experts found no LatentMoE in the model: nothing to shard "
                         "(a profile with n_dense_layers = n_layers has no MoE layer)")
    return wrapped
