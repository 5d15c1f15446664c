"""Parallelism applied to a built K3Model from outside it (DESIGN.md §2, §4 Systems).

The model files stay single-device; these modules wrap or drive them over torch.distributed:

- `expert_parallel`: `ExpertParallelMoE` / `parallelize_experts` shard LatentMoE's routed experts
  over ranks and move tokens with all-to-all; `sync_balancing_stats` makes the bias update global.
- `data_parallel`: the data-parallel training step (bucketed gradient all-reduce, global-norm clip,
  global balancing statistics), a timed worker, and `launch_local` / `run_data_parallel_local`
  (torch.multiprocessing, NCCL or gloo).
- `pipelines.ray_launch.run_data_parallel` runs the same worker in one Ray actor per rank; it lives
  in the orchestration layer because k3model imports no Ray (DESIGN.md §2).

Context-parallel KDA lives with its kernels, in `kernels.kda.cp`.
"""

from k3model.parallel.data_parallel import (DataParallelConfig, allreduce_gradients, broadcast_parameters,
                                            clip_grad_norm, data_parallel_train_step, data_parallel_worker,
                                            init_distributed, launch_local, run_data_parallel_local)
from k3model.parallel.expert_parallel import (ExpertParallelMoE, all_to_all_rows, expert_range,
                                              parallelize_experts, parallelize_moe, sync_balancing_stats)

__all__ = ["DataParallelConfig", "ExpertParallelMoE", "all_to_all_rows", "allreduce_gradients",
           "broadcast_parameters", "clip_grad_norm", "data_parallel_train_step", "data_parallel_worker",
           "expert_range", "init_distributed", "launch_local", "parallelize_experts", "parallelize_moe",
           "run_data_parallel_local", "sync_balancing_stats"]
