"""Can a profile's model learn the scattered-clue task at all? A diagnostic for claim 1 (DESIGN.md §5).

The tiny `make run` answers clue questions near chance at every stage, the control twin (needed clues
right before the question) included, so the claim cannot be judged from it. This probe trains one
model from scratch on clue rows (clue_fraction = 1 by default, no images) at one context length and scores
the clue eval grid (scattered and control, by distance bucket) every `--eval-every` steps. If the
control stays at chance too, the failure is the task's difficulty at this size and budget, not
long-range recall.

    OMP_NUM_THREADS=2 python benchmarks/recipes/clue_probe.py --data-home .k3 --profile tiny --seq-len 512 \\
        --steps 450 --batch-size 8 --out benchmarks/results/train/2026-11-29_clue_probe_tiny_cpu.json

`--data-home` is a K3_HOME whose data assets exist for the profile (`k3 run --select
tokenizer,corpus,clue_data,image_data`); the newest version of each is used.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from benchmarks.common import newest_data, run_header
from k3model.model import K3Model
from k3model.train.pretrain import PretrainConfig, build_optimizer, train_step
from k3model.train.pretrain_data import PretrainData, StageBatches
from k3model.train.pretrain_eval import clue_accuracy
from k3model.schedule import lr_at

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-home", default=".k3")
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=450)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-every", type=int, default=150)
    parser.add_argument("--pairs-per-cell", type=int, default=16)
    parser.add_argument("--clue-loss", choices=("answer", "all"), default="answer",
                        help="answer: clue rows train on their answers, with their own mean (the pipeline's "
                             "default); all: every token, one mean")
    parser.add_argument("--clue-fraction", type=float, default=1.0,
                        help="clue rows per batch; the rest are text rows, as in the pipeline (no images)")
    parser.add_argument("--out", default="benchmarks/results/clue_probe.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    data = newest_data(Path(args.data_home), args.profile)
    cfg = PretrainConfig(profile=args.profile, stage=2, seq_len=args.seq_len, steps=args.steps,
                         batch_size=args.batch_size, lr=args.lr, clue_fraction=args.clue_fraction,
                         image_fraction=0.0, clue_loss=args.clue_loss)
    stage = cfg.resolved()
    model = K3Model(stage.model)
    optimizer = build_optimizer(model, stage.lr, cfg.weight_decay)
    batches = StageBatches(data, stage.model, seq_len=stage.seq_len, batch_size=stage.batch_size,
                           seed=cfg.seed, stage=cfg.stage, clue_fraction=args.clue_fraction, image_fraction=0.0,
                           clue_loss=args.clue_loss)
    batches.pack(stage.steps * stage.batch_size)
    result = {"header": run_header(), "args": vars(args), "threads": torch.get_num_threads(), "load_avg_start": os.getloadavg()[0],
              "evals": [], "losses": []}
    warmup = max(int(cfg.warmup_frac * stage.steps), 1)
    t0 = time.perf_counter()
    for step in range(stage.steps):
        lr = lr_at(step, stage.steps, stage.lr, warmup, cfg.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = batches.batch(step)
        metrics = train_step(model, optimizer, batch, cfg.grad_clip, "cpu")
        result["losses"].append(round(metrics["train/main"], 4))
        if (step + 1) % args.eval_every == 0 or step + 1 == stage.steps:
            model.eval()
            acc = clue_accuracy(model, data, "cpu", args.pairs_per_cell, max_length=args.seq_len)
            row = {"step": step + 1, "loss": metrics["train/main"], "wall_s": time.perf_counter() - t0,
                   **{k.removeprefix("eval/clue_acc/"): v for k, v in acc.items() if "/len" not in k}}
            result["evals"].append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            result["load_avg_end"] = os.getloadavg()[0]
            Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
