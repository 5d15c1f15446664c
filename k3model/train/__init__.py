"""Training algorithms (DESIGN.md §2): each a plain `train(cfg, ...) -> Result` with no side effects
at import, its config extending `common.LoopConfig` and its loop framed by `common.Loop`.

Shared pieces and vocabulary
- `common`: LoopConfig, Loop, optimizer, autocast, the clipped (and accumulating) step, MoE
  balancing, resume, metric buffer.
- `effort`: domains, efforts, effort specs (budgets, length terms), harness sets, routes and
  their partition keys.
- `recipes`: every profile's post-training sizes and the held-out evaluation plan (no Dagster).
- `qat`: quantization-aware training applied to a built model from outside it (`prepare_qat`).
- `flops`: counted FLOPs of a step (the equal-compute control's budget).
- `muon`: Per-Head Muon, the alternative to AdamW (`common.build_optimizer`'s `optimizer`).
- `stats`: the statistics claims are judged with (intervals, the paired test, Holm, power).
Loading a checkpoint is `k3model.checkpoint.load_model`.

Trainers, in lineage order
- `pretrain` (+ `pretrain_data`, `pretrain_eval`): one pretraining stage, its batches, its evaluation.
- `sft`: supervised fine-tuning on `datagen.sft` demonstrations, loss on the model's own tokens.
- `grpo`: the RL specialists (advantages, filtering, the clipped TIS loss, length terms, the loop).
- `mopd`: multi-teacher on-policy distillation of the specialists into one student.
- `draft`: the EAGLE-3-style speculative-decoding draft.

Evaluation and rollouts
- `rollout`: episodes played in envs, many at once (`play_tasks`).
- `evaluate`: the one evaluator, a policy scored on tasks (`evaluate`, batched `evaluate_together`,
  `per_harness`); the modules below name the tasks and call it.
- `expert_load`: expert load of a checkpoint on a held-out set (claim 2).
- `ladder`: the RL task ladder and the held-out plans (`measure_ladder`, `evaluate_policy`).

Experiments composed from the above
- `transfer` (claim 7's cross-harness folds), `control` (the equal-compute generalist),
  `sft_control` (the equal-token SFT arm of an RL specialist), `quant_compare` (claim 5's QAT/PTQ
  comparison).
"""
