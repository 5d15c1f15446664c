"""Data-parallel training launched through Ray: one actor per GPU (or per CPU rank with gloo).

    result = run_data_parallel(DataParallelConfig(profile="small", world_size=8, backend="nccl",
                                                  device="cuda"))

Each actor asks Ray for one GPU (Ray sets its CUDA_VISIBLE_DEVICES, so it sees `cuda:0`) or, on a
CPU machine, one CPU; actor 0 reports its node address and a free port, every actor joins the
process group at that MASTER_ADDR/MASTER_PORT and runs `data_parallel_worker` — the same function
the torch.multiprocessing launcher (`data_parallel.run_data_parallel_local`) runs, so the two
launchers measure the same step.

Why it lives in pipelines/: DESIGN.md §2 keeps k3model free of Ray (the GPU machine has no Ray, and
`import k3model` must work with only torch and triton), so the Ray side of data parallelism sits in
the orchestration layer and drives k3model's plain `data_parallel_worker`. `ray` is imported inside
`run_data_parallel`, so importing this module does not start or need a cluster.

A Ray cluster already initialized in this process (or `RAY_ADDRESS`) is used and left running;
otherwise a private local one is started and shut down on return.
"""

from __future__ import annotations

import os
import time
from typing import Any

from k3model.parallel.data_parallel import DataParallelConfig


class _RankActor:
    """One rank: joins the process group, runs the worker, leaves the group."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size

    def address(self) -> tuple[str, int]:
        import ray

        from k3model.parallel.data_parallel import free_port
        return ray.util.get_node_ip_address(), free_port()

    def run(self, cfg: DataParallelConfig, master_addr: str, master_port: int, threads: int) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        from k3model.parallel.data_parallel import data_parallel_worker, init_distributed
        torch.set_num_threads(threads)
        init_distributed(self.rank, self.world_size, cfg.backend, master_addr, master_port,
                         "cuda" if cfg.device == "cuda" else "cpu")
        # Left in place on failure (destroying a group mid-collective can block); the driver kills
        # the actors.
        result = data_parallel_worker(self.rank, self.world_size, cfg)
        dist.destroy_process_group()
        return result


def run_data_parallel(cfg: DataParallelConfig, timeout_s: float = 600.0,
                      cpus_per_rank: int = 1) -> dict[str, Any]:
    """Run `cfg.world_size` ranks as Ray actors; returns rank 0's result (tokens/s and metrics)."""
    try:
        import ray
    except ImportError as err:
        raise ValueError("run_data_parallel needs Ray (pip install ray); without it use "
                         "k3model.parallel.data_parallel.run_data_parallel_local") from err

    started_here = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or None
        if address:
            ray.init(address=address)
        else:
            # Ray 2.60 turns on token auth for new clusters; a private local one needs none.
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(num_cpus=max(cfg.world_size * cpus_per_rank, os.cpu_count() or 1),
                     object_store_memory=128 << 20, include_dashboard=False, log_to_driver=True)
        started_here = True
    gpus = 1 if cfg.device == "cuda" else 0
    cluster_gpus = ray.cluster_resources().get("GPU", 0)
    if gpus and cluster_gpus < cfg.world_size:
        if started_here:
            ray.shutdown()
        raise ValueError(f"{cfg.world_size} ranks need {cfg.world_size} GPUs but the Ray cluster has "
                         f"{cluster_gpus:g}: lower world_size or use device='cpu'")
    actor_cls = ray.remote(num_cpus=cpus_per_rank, num_gpus=gpus, max_restarts=0)(_RankActor)
    actors = [actor_cls.remote(rank, cfg.world_size) for rank in range(cfg.world_size)]
    try:
        master_addr, master_port = ray.get(actors[0].address.remote(), timeout=timeout_s)
        refs = [a.run.remote(cfg, master_addr, master_port, cpus_per_rank) for a in actors]
        # Collect as ranks finish, so a failed rank raises at once instead of after the others
        # (stuck in a collective with it) time out.
        pending, deadline = list(refs), time.monotonic() + timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0.0))
            if not ready:
                raise TimeoutError(f"data-parallel ranks did not finish within {timeout_s:.0f} s")
            ray.get(ready)
        results = ray.get(refs)
    finally:
        for a in actors:
            ray.kill(a)
        if started_here:
            ray.shutdown()
    return results[0]
