"""Data-parallel pretraining step of K3Model over torch.distributed, and a local process launcher.

Each rank holds a full replica (or, with `expert_parallel=True`, a replica whose routed experts are
sharded by `parallelize_experts`) and its own rows of the global batch. One step:

    loss_r = model.compute_loss(batch_r)                   local rows, local mean
    backward
    g ← (1/W) Σ_r g_r                                       bucketed all-reduce (SUM then ÷W; gloo has no AVG)
    clip by the global norm;  optimizer.step()
    loads and margin histograms summed over ranks → LatentMoE.update_bias()   (same bias everywhere)

With every rank holding the same number of labelled tokens, (1/W)Σ_r of the ranks' mean losses is
the mean loss of the concatenated batch, so one step here equals one single-process step on the
concatenation, up to fp32 rounding (tests/k3model/parallel). With unequal counts it is DDP's usual
average of per-rank means. Gradients are reduced after backward, not overlapped with it as DDP's
bucket hooks do: simpler, and the benchmark's scaling efficiency shows what that costs. Expert-
sharded weights are not all-reduced (their owner already holds the gradient from every rank's
tokens) but are divided by W the same way. A parameter that got a gradient on some rank and not on
another (an image batch on one rank only) is taken as zero where missing, as the concatenated batch
would give; one that got none anywhere keeps `grad = None`, so AdamW skips it as single-process would.

Launchers: `run_data_parallel_local` spawns one process per rank with torch.multiprocessing (NCCL
and one GPU each, or gloo on the CPU); `pipelines.ray_launch.run_data_parallel` runs the same
`data_parallel_worker` in one Ray actor per rank. Both return tokens/s for a few timed steps on
random tokens (speed, not learning).

Legend: B rows per rank, T tokens, W ranks.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from k3model.config import get_profile
from k3model.model import K3Model, default_labels
from k3model.parallel.expert_parallel import ExpertParallelMoE, parallelize_experts, sync_balancing_stats
from k3model.train.common import autocast_for, balance_experts, build_optimizer, optimizer_step

BACKENDS = ("gloo", "nccl")
BUCKET_MB = 64


@dataclass
class TokenBatch:
    """The fields `data_parallel_train_step` reads; `k3model.train.pretrain_data.Batch` has the same ones.

    Not imported from there: pretrain_data pulls in datagen (pyarrow, tokenizers), and this module
    must run where only torch and triton are installed (DESIGN.md §7).
    """
    input_ids: torch.Tensor  # [B, T] int64
    labels: torch.Tensor  # [B, T], IGNORE_INDEX where nothing is predicted
    images: torch.Tensor | None = None
    image_mask: torch.Tensor | None = None


# One optimizer for every trainer; the old name stays for callers of this module.
build_adamw = build_optimizer


# ----------------------------------------------------------------------------------------------
# Process group

def free_port() -> int:
    """A TCP port free on this host right now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(rank: int, world_size: int, backend: str, master_addr: str, master_port: int,
                     device: str = "cpu") -> torch.device:
    """Join the default process group; returns this rank's device (`cuda:i` or `cpu`).

    `device` is "cpu" or a CUDA device string ("cuda" means the current device, "cuda:3" that one);
    NCCL needs a CUDA device, gloo runs on either.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    torch_device = torch.device(device)
    if backend == "nccl" and torch_device.type != "cuda":
        raise ValueError("the nccl backend needs device='cuda'; use backend='gloo' for the CPU")
    if torch_device.type == "cuda":
        if torch_device.index is None:
            torch_device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(torch_device)
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = torch_device
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(minutes=5), **kwargs)
    return torch_device


def _worker_entry(local_rank: int, fn: Callable, world_size: int, backend: str, device: str, port: int,
                  threads: int, args: tuple, queue) -> None:
    torch.set_num_threads(threads)
    rank_device = f"cuda:{local_rank}" if device == "cuda" else device
    init_distributed(local_rank, world_size, backend, "127.0.0.1", port, rank_device)
    # No try/finally: after a failure mid-collective, destroying the group can block, and the
    # process must exit so the launcher sees the error and stops the other ranks.
    result = fn(local_rank, world_size, *args)
    queue.put((local_rank, result))
    dist.destroy_process_group()


def launch_local(fn: Callable[..., Any], world_size: int, args: tuple = (), backend: str = "gloo",
                 device: str = "cpu", threads_per_rank: int | None = None) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` spawned processes joined in one process group.

    `fn` must be importable (a module-level function). With device="cuda" rank i uses GPU i.
    Returns the ranks' return values in rank order (they travel through a pipe: keep them small).
    If a rank raises, the others are terminated and the error is raised here.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be ≥ 1, got {world_size}")
    if device == "cuda" and world_size > torch.cuda.device_count():
        raise ValueError(f"world_size {world_size} needs {world_size} GPUs, this machine has "
                         f"{torch.cuda.device_count()}: lower world_size")
    # On a shared, loaded CPU more threads than cores per rank can slow a step twentyfold (seen
    # here: 0.12 s at 1 thread, 4.2 s at 2, on a 2-core machine with load 12); pass 1 there.
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // world_size)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = mp.spawn(_worker_entry, args=(fn, world_size, backend, device, free_port(), threads, args, queue),
                     nprocs=world_size, join=False)
    results: dict[int, Any] = {}
    # Read while waiting: a rank blocks on a full pipe until its result is read, and a failed rank
    # must surface through join (which terminates the rest) rather than leave us waiting on the queue.
    while len(results) < world_size:
        while not queue.empty():
            rank, value = queue.get()
            results[rank] = value
        if len(results) < world_size and procs.join(timeout=0.05):
            break
    while not procs.join(timeout=1.0):
        pass
    while not queue.empty():
        rank, value = queue.get()
        results[rank] = value
    if len(results) != world_size:
        raise RuntimeError(f"only ranks {sorted(results)} of {world_size} returned a result")
    return [results[r] for r in range(world_size)]


# ----------------------------------------------------------------------------------------------
# Gradients

def _expert_param_ids(model: nn.Module) -> set[int]:
    return {id(p) for m in model.modules() if isinstance(m, ExpertParallelMoE) for p in m.expert_parameters()}


@torch.no_grad()
def broadcast_parameters(model: nn.Module, group=None, src: int = 0) -> None:
    """Copy rank `src`'s replicated parameters and buffers to every rank (expert shards stay)."""
    sharded = _expert_param_ids(model)
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in sharded:
            dist.broadcast(t.data, src=src, group=group)


@torch.no_grad()
def allreduce_gradients(model: nn.Module, group=None, bucket_mb: int = BUCKET_MB) -> None:
    """Average the replicated gradients over `group` and divide the expert-sharded ones by W.

    Gradients are packed into flat buckets of at most `bucket_mb` MiB per dtype, one all-reduce each.
    """
    world = dist.get_world_size(group)
    sharded = _expert_param_ids(model)
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in sharded]
    if world == 1:
        return
    has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.int32,
                            device=params[0].device if params else "cpu")
    dist.all_reduce(has_grad, op=dist.ReduceOp.MAX, group=group)
    reduced = []
    for p, any_rank in zip(params, has_grad.tolist()):
        if any_rank:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            reduced.append(p)
    by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
    for p in reduced:
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    limit = bucket_mb << 20
    for dtype, ps in by_dtype.items():
        bucket: list[nn.Parameter] = []
        size = 0
        for p in ps + [None]:
            if p is not None and (not bucket or size + p.grad.numel() * p.grad.element_size() <= limit):
                bucket.append(p)
                size += p.grad.numel() * p.grad.element_size()
                continue
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            dist.all_reduce(flat, group=group)
            flat.div_(world)
            for q, g in zip(bucket, flat.split([q.grad.numel() for q in bucket])):
                q.grad.copy_(g.view_as(q.grad))
            bucket, size = ([p], p.grad.numel() * p.grad.element_size()) if p is not None else ([], 0)
    for p in model.parameters():
        if id(p) in sharded and p.grad is not None:
            p.grad.div_(world)


@torch.no_grad()
def clip_grad_norm(model: nn.Module, max_norm: float, group=None) -> torch.Tensor:
    """Clip by the global gradient norm; returns the norm before clipping.

    Replicated gradients are equal on every rank after `allreduce_gradients` and count once; the
    expert shards' squared norms are summed over ranks.
    """
    sharded = _expert_param_ids(model)
    grads_rep = [p.grad for p in model.parameters() if p.grad is not None and id(p) not in sharded]
    grads_exp = [p.grad for p in model.parameters() if p.grad is not None and id(p) in sharded]
    device = (grads_rep or grads_exp)[0].device
    sq_rep = sum((g.float().pow(2).sum() for g in grads_rep), torch.zeros((), device=device))
    sq_exp = sum((g.float().pow(2).sum() for g in grads_exp), torch.zeros((), device=device))
    if sharded:
        dist.all_reduce(sq_exp, group=group)
    norm = (sq_rep + sq_exp).sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in grads_rep + grads_exp:
        g.mul_(scale.to(g.dtype))
    return norm


# ----------------------------------------------------------------------------------------------
# The step

def data_parallel_train_step(model: K3Model, optimizer: torch.optim.Optimizer, batch: TokenBatch, grad_clip: float,
                             group=None) -> dict[str, float]:
    """One data-parallel optimizer step on this rank's rows; metrics are means over ranks.

    `k3model.train.pretrain.step_metrics` with the gradient all-reduce, a global-norm clip and globally
    summed balancing statistics plugged into `k3model.train.common`'s step. Call on every rank of `group`.
    """
    device = batch.input_ids.device
    model.train()
    with autocast_for(device):
        # The answer mean (pretrain_data.StageBatches clue_loss="answer") is this rank's.
        losses = model.compute_loss(batch.input_ids, batch.labels, batch.images, batch.image_mask,
                                    answer_mask_BT=getattr(batch, "answer_mask", None))
    grad_norm = optimizer_step(model, optimizer, losses["loss/total"], grad_clip,
                               reduce=lambda m: allreduce_gradients(m, group),
                               clip=lambda m, max_norm: clip_grad_norm(m, max_norm, group))
    balance = balance_experts(model, reduce_loads=lambda loads_NE: dist.all_reduce(loads_NE, group=group),
                              sync=lambda m: sync_balancing_stats(m, group))

    names = list(losses)
    loss_vec = torch.stack([losses[k].detach().float() for k in names])
    dist.all_reduce(loss_vec, group=group)
    loss_vec /= dist.get_world_size(group)
    metrics = {f"train/{k.split('/', 1)[1]}": float(v) for k, v in zip(names, loss_vec.tolist())}
    metrics["train/grad_norm"] = float(grad_norm)
    metrics.update({k: float(v) for k, v in balance.items()})
    return metrics


# ----------------------------------------------------------------------------------------------
# A timed run (what both launchers execute on each rank)

@dataclass(frozen=True)
class DataParallelConfig:
    """A short data-parallel run on random tokens, for throughput: `batch_size` rows per rank."""
    profile: str = "smoke"
    world_size: int = 2
    steps: int = 3  # timed steps
    warmup_steps: int = 1
    batch_size: int = 2
    seq_len: int = 64
    lr: float = 1e-3
    grad_clip: float = 1.0
    backend: str = "gloo"
    device: str = "cpu"  # "cpu" or "cuda"
    seed: int = 0
    expert_parallel: bool = False
    mtp: bool = True  # keep the profile's MTP module(s); vision is dropped (random tokens carry no images)

    def __post_init__(self) -> None:
        get_profile(self.profile)
        if self.profile == "k3":
            raise ValueError("profile 'k3' is never instantiated: choose smoke, tiny or small")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError("backend 'nccl' needs device 'cuda'; use backend 'gloo' on the CPU")
        for name in ("world_size", "steps", "batch_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be ≥ 0, got {self.warmup_steps}")


def build_replica(cfg: DataParallelConfig, device: torch.device, group=None) -> K3Model:
    """The profile's model (no vision), identical on every rank, experts sharded if asked."""
    model_cfg = replace(get_profile(cfg.profile).model, vision=None,
                        **({} if cfg.mtp else {"mtp_depth": 0}))
    torch.manual_seed(cfg.seed)
    # Built in place on its device: initializing 700M parameters on the CPU first costs seconds.
    with device:
        model = K3Model(model_cfg)
    broadcast_parameters(model, group)
    if cfg.expert_parallel:
        parallelize_experts(model, group)
    return model


def random_batch(cfg: DataParallelConfig, step: int, rank: int, vocab: int, device: torch.device) -> TokenBatch:
    """Rows of uniform random tokens, a pure function of (seed, step, rank)."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 1009 + rank)
    ids_BT = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len), generator=gen).to(device)
    return TokenBatch(ids_BT, default_labels(ids_BT))


def data_parallel_worker(rank: int, world_size: int, cfg: DataParallelConfig) -> dict[str, Any]:
    """Build the replica, run warmup + timed steps; returns this rank's timing and the last metrics.

    Needs the default process group initialized (by a launcher). The step time is the slowest rank's.
    """
    group = None
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.device == "cuda" else torch.device("cpu")
    model = build_replica(cfg, device, group)
    optimizer = build_optimizer(model, cfg.lr, weight_decay=0.1)
    vocab = model.cfg.vocab_size
    metrics: dict[str, float] = {}
    for step in range(cfg.warmup_steps):
        metrics = data_parallel_train_step(model, optimizer, random_batch(cfg, step, rank, vocab, device),
                                           cfg.grad_clip, group)
    batches = [random_batch(cfg, cfg.warmup_steps + s, rank, vocab, device) for s in range(cfg.steps)]
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for batch in batches:
        metrics = data_parallel_train_step(model, optimizer, batch, cfg.grad_clip, group)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    seconds = float(elapsed)
    tokens = world_size * cfg.batch_size * cfg.seq_len * cfg.steps
    out = {"rank": rank, "world_size": world_size, "seconds": seconds, "step_s": seconds / cfg.steps,
           "tokens_per_s": tokens / seconds, "tokens_per_s_per_rank": tokens / seconds / world_size,
           "metrics": metrics, "config": asdict(cfg)}
    if device.type == "cuda":
        out["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def run_data_parallel_local(cfg: DataParallelConfig, threads_per_rank: int | None = None) -> dict[str, Any]:
    """`data_parallel_worker` in `cfg.world_size` local processes (torch.multiprocessing); rank 0's result."""
    return launch_local(data_parallel_worker, cfg.world_size, (cfg,), backend=cfg.backend, device=cfg.device,
                        threads_per_rank=threads_per_rank)[0]
