"""Rank functions for the multi-process tests (spawned processes import them from here).

Every rank builds the single-device reference itself from the same seed, runs it on the global
batch, runs the parallel version on its own rows, and returns relative errors (small floats, not
tensors, travel back through the launcher's pipe).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
import torch.distributed as dist

from k3model.config import MoEConfig, get_profile
from k3model.model import K3Model, default_labels
from k3model.moe import LatentMoE
from k3model.parallel import (ExpertParallelMoE, all_to_all_rows, data_parallel_train_step, parallelize_experts,
                              parallelize_moe)
from k3model.train.pretrain import build_optimizer, train_step
from k3model.train.pretrain_data import Batch

ROWS_PER_RANK = 2
SEQ = 24


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).norm() / ref.norm().clamp(min=1e-30))


def moe_cfg(**overrides) -> MoEConfig:
    base = MoEConfig(d_model=32, n_routed=8, top_k=2, n_shared=1, latent_dim=32, expert_hidden=32,
                     shared_hidden=32)
    return replace(base, **overrides)


def _full_moe(cfg: MoEConfig, bias_E: torch.Tensor, quantile_method: str = "histogram") -> LatentMoE:
    torch.manual_seed(0)
    moe = LatentMoE(cfg, quantile_method=quantile_method)
    with torch.no_grad():
        moe.expert_bias_E.copy_(bias_E)
    return moe


def _global_inputs(world: int, d_model: int, skew: float = 0.0):
    gen = torch.Generator().manual_seed(1)
    x_BTD = torch.randn(world * ROWS_PER_RANK, SEQ, d_model, generator=gen)
    x_BTD[..., 0] += skew
    w_BTD = torch.randn(world * ROWS_PER_RANK, SEQ, d_model, generator=gen)
    return x_BTD, w_BTD


def ep_forward_backward(rank: int, world: int, case: str) -> dict[str, float]:
    """EP layer vs the single-device layer: outputs, input grads, every parameter grad.

    Cases: "plain"; "rank0_only" (a bias sends every token to rank 0's experts, so the other ranks
    receive no rows); "qat" (MXFP4/MXFP8 fake quantization on the experts).
    """
    cfg = moe_cfg(qat=case == "qat")
    bias_E = torch.linspace(-0.05, 0.05, cfg.n_routed)
    if case == "rank0_only":
        bias_E = torch.full((cfg.n_routed,), -5.0)
        bias_E[: cfg.n_routed // world] = 5.0
    ref = _full_moe(cfg, bias_E)
    ep_moe = copy.deepcopy(ref)
    x_BTD, w_BTD = _global_inputs(world, cfg.d_model)
    rows = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)

    x_ref = x_BTD.clone().requires_grad_(True)
    y_ref = ref(x_ref)
    (y_ref * w_BTD).sum().backward()

    ep = parallelize_moe(ep_moe)
    x_loc = x_BTD[rows].clone().requires_grad_(True)
    y_loc = ep(x_loc)
    (y_loc * w_BTD[rows]).sum().backward()
    ep.reduce_gradients(average=False)

    errs = {"out": rel_err(y_loc, y_ref[rows]), "grad_x": rel_err(x_loc.grad, x_ref.grad[rows])}
    lo, hi = ep.expert_start, ep.expert_stop
    for name, p in ref.named_parameters():
        got = dict(ep.moe.named_parameters())[name]
        want = p.grad[lo:hi] if name.startswith("w_") else p.grad
        errs[f"grad/{name}"] = rel_err(got.grad, want)
    errs["rows_to_this_rank"] = float(rows_to_rank(ep, x_loc))
    return errs


def rows_to_rank(ep: ExpertParallelMoE, x_loc: torch.Tensor) -> int:
    """How many (token, expert) rows of all ranks' tokens go to this rank's experts."""
    with torch.no_grad():
        ids_MK, _, _, _ = ep.moe.route(x_loc.reshape(-1, x_loc.shape[-1]))
    counts_E = torch.bincount(ids_MK.reshape(-1), minlength=ep.cfg.n_routed)
    dist.all_reduce(counts_E)
    return int(counts_E[ep.expert_start:ep.expert_stop].sum())


def ep_average_gradients(rank: int, world: int) -> dict[str, float]:
    """reduce_gradients(average=True) gives the gradient of the mean of the ranks' losses."""
    cfg = moe_cfg()
    ref = _full_moe(cfg, torch.zeros(cfg.n_routed))
    ep = parallelize_moe(copy.deepcopy(ref))
    x_BTD, w_BTD = _global_inputs(world, cfg.d_model)
    rows = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)
    # Single device: mean over ranks of per-rank means = the mean over the global batch here.
    (ref(x_BTD) * w_BTD).mean().backward()
    (ep(x_BTD[rows]) * w_BTD[rows]).mean().backward()
    ep.reduce_gradients(average=True)
    errs = {}
    for name, p in ref.named_parameters():
        got = dict(ep.moe.named_parameters())[name]
        want = p.grad[ep.expert_start:ep.expert_stop] if name.startswith("w_") else p.grad
        errs[f"grad/{name}"] = rel_err(got.grad, want)
    return errs


def ep_bias_update(rank: int, world: int, balancing: str, method: str) -> dict[str, float]:
    """Two training forwards + update_bias on EP equal the single-device update on the global batch."""
    cfg = moe_cfg(balancing=balancing, n_shared=0)
    ref = _full_moe(cfg, torch.zeros(cfg.n_routed), quantile_method=method).train()
    ep = parallelize_moe(copy.deepcopy(ref)).train()
    rows = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)
    biases = []
    with torch.no_grad():
        for step in range(2):
            # Skewed inputs, so the update is large and far from zero.
            x_BTD, _ = _global_inputs(world, cfg.d_model, skew=1.5 + step)
            ref(x_BTD)
            ep(x_BTD[rows])
            ref.update_bias()
            ep.update_bias()
            biases.append((ep.moe.expert_bias_E.clone(), ref.expert_bias_E.clone()))
    all_bias = [torch.zeros(cfg.n_routed) for _ in range(world)]
    dist.all_gather(all_bias, ep.moe.expert_bias_E)
    return {"bias_step1": rel_err(*biases[0]), "bias_step2": rel_err(*biases[1]),
            "bias_norm": float(biases[1][1].norm()),
            "ranks_disagree": max(float((b - all_bias[0]).abs().max()) for b in all_bias)}


def uneven_exchange(rank: int, world: int) -> dict[str, float]:
    """all_to_all_rows with uneven splits: rank r sends r+1 rows to rank 0 and the rest one each.

    Row i of rank r holds 100·r + i, so each received row says where it came from."""
    send = [rank + 1] + [1] * (world - 1)
    x = torch.arange(float(sum(send))) + 100 * rank
    recv = [w + 1 for w in range(world)] if rank == 0 else [1] * world
    got = all_to_all_rows(x, recv, send).tolist()
    if rank == 0:
        want = [100.0 * w + i for w in range(world) for i in range(w + 1)]
    else:
        want = [100.0 * w + (w + 1) + (rank - 1) for w in range(world)]
    return {"mismatch": float(got != want), "rows": float(len(got))}


def ep_all_cases(rank: int, world: int) -> dict[str, dict[str, float]]:
    out = {f"fwd_bwd/{c}": ep_forward_backward(rank, world, c) for c in ("plain", "rank0_only", "qat")}
    out["average"] = ep_average_gradients(rank, world)
    out["uneven_exchange"] = uneven_exchange(rank, world)
    for balancing, method in (("quantile", "histogram"), ("quantile", "exact"), ("deepseek", "histogram")):
        out[f"bias/{balancing}/{method}"] = ep_bias_update(rank, world, balancing, method)
    return out


# ----------------------------------------------------------------------------------------------
# Data parallel

def smoke_model() -> K3Model:
    cfg = replace(get_profile("smoke").model, vision=None)
    torch.manual_seed(0)
    return K3Model(cfg)


def dp_step_vs_single(rank: int, world: int, expert_parallel: bool) -> dict[str, float]:
    """One data-parallel step on each rank's rows vs pretrain.train_step on the concatenated batch."""
    torch.manual_seed(123)
    ids_BT = torch.randint(0, 512, (world * ROWS_PER_RANK, SEQ))
    rows = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)

    ref = smoke_model()
    model = copy.deepcopy(ref)
    ref_opt = build_optimizer(ref, lr=1e-3, weight_decay=0.1)
    ref_metrics = train_step(ref, ref_opt, Batch(ids_BT, default_labels(ids_BT), None, None), 1.0, "cpu")

    if expert_parallel:
        parallelize_experts(model)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    local = ids_BT[rows]
    metrics = data_parallel_train_step(model, opt, Batch(local, default_labels(local), None, None), 1.0)

    ref_params = dict(ref.named_parameters())
    worst_param, diff_sq, update_sq = 0.0, 0.0, 0.0
    for name, p in model.named_parameters():
        want = ref_params[name.replace(".moe.", ".")].detach()
        if p.shape != want.shape:  # an expert shard
            n_local = p.shape[0]
            want = want[rank * n_local:(rank + 1) * n_local]
        worst_param = max(worst_param, rel_err(p.detach(), want))
        # The update itself (weights move by ~lr): a stricter view than the weights.
        diff_sq += float((p.detach() - want).double().pow(2).sum())
        update_sq += float((want - before[name]).double().pow(2).sum())
    ref_biases = [m.expert_bias_E for m in ref.moe_layers()]
    biases = [m.expert_bias_E for m in model.modules() if isinstance(m, LatentMoE)]
    return {"params": worst_param, "update": (diff_sq / update_sq) ** 0.5,
            "bias": max(rel_err(b, r) for b, r in zip(biases, ref_biases)),
            "bias_norm": min(float(r.norm()) for r in ref_biases),
            "loss": abs(metrics["train/total"] - ref_metrics["train/total"]),
            "grad_norm": abs(metrics["train/grad_norm"] - ref_metrics["train/grad_norm"]) / ref_metrics["train/grad_norm"]}


def dp_cases(rank: int, world: int) -> dict[str, dict[str, float]]:
    return {"dp": dp_step_vs_single(rank, world, expert_parallel=False),
            "dp+ep": dp_step_vs_single(rank, world, expert_parallel=True)}


def fail_on_rank1(rank: int, world: int) -> int:
    """Rank 1 raises while rank 0 waits in a collective for it."""
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.barrier()
    return rank
