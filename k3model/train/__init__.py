"""Training algorithms (DESIGN.md §2): each a plain `train(cfg, ...) -> Result` with no side effects
at import, standing on `common` (optimizer, autocast, clipped step, MoE balancing, resume, metric
buffer).

- `common`: the shared pieces.
- `qat`: quantization-aware training applied to a built model from outside it (`prepare_qat`).
- `sft`: supervised fine-tuning on `datagen.sft` demonstrations, loss on the model's own tokens.
- `grpo`: the pure parts of the GRPO-family update (advantages, filtering, loss, length terms).

Pretraining lives in `k3model.train.pretrain` (it stands on `common` too).
"""
