"""Claim 2 in real training: expert load max/mean with quantile balancing, DeepSeek's fixed-step bias
update, and no balancing, on the same pretraining stage (DESIGN.md §5).

    python benchmarks/probes/balancing_ablation.py --profile tiny --steps 60 --out benchmarks/results/train/2026-11-29_balancing_tiny_cpu.json

Each arm trains stage 1 from the same initialization and batches; only `balancing` differs. The
unit test of the balancer (tests/k3model/test_moe.py) uses a frozen, deliberately skewed router;
this measures the same thing while the router itself is learning. A last arm, `quantile_frozen`,
runs the same batches with the learning rate at 0: the bias still updates every step, so its
max/mean is the floor that batch-to-batch variation alone leaves at this batch size (the bias is
set from one batch and applied to the next).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

import datagen
from benchmarks.common import run_header
from datagen.build import build_all
from k3model.model import K3Model
from k3model.train.pretrain import PretrainConfig, build_optimizer, train, train_step
from k3model.train.pretrain_data import PretrainData, StageBatches

ARMS = ("quantile", "deepseek", "none")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--data-profile", default="smoke", help="datagen preset (smoke builds in seconds)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", required=True, help="e.g. benchmarks/results/train/<date>_balancing_tiny_cpu.json")
    args = parser.parse_args()

    results = {"profile": args.profile, "steps": args.steps, "arms": {},
               "header": run_header()}
    with tempfile.TemporaryDirectory() as tmp:
        data_cfg = datagen.presets(args.data_profile)
        build_all(data_cfg, Path(tmp) / "data")
        d = Path(tmp) / "data"
        data = PretrainData(d / "tokenizer.json", d / "corpus.parquet", d / "images.parquet",
                            d / "clue_eval.parquet", clues=data_cfg.clues)
        for arm in ARMS:
            t0 = time.perf_counter()
            cfg = PretrainConfig(profile=args.profile, stage=1, steps=args.steps, balancing=arm,
                                 eval_examples_per_cell=1, eval_max_length=64, eval_ppl_windows=2,
                                 eval_vqa_questions=4, log_every=args.steps)
            result = train(cfg, data, Path(tmp) / arm)
            loads = [h["moe/load_max_over_mean"] for h in result.history]
            worst = [h["moe/load_max_over_mean_worst"] for h in result.history]
            tail = loads[-max(len(loads) // 4, 1):]
            results["arms"][arm] = {
                "load_max_over_mean": loads, "load_worst_layer": worst,
                "last_quarter_mean": sum(tail) / len(tail),
                "final_loss": result.eval.get("train/final_loss"), "wall_s": time.perf_counter() - t0,
            }
            print(f"{arm:9s} load max/mean, mean of the last quarter: {results['arms'][arm]['last_quarter_mean']:.3f}"
                  f"  final loss {result.eval.get('train/final_loss'):.3f}", flush=True)
        t0 = time.perf_counter()
        loads = frozen_router_loads(data, args.profile, args.steps)
        tail = loads[-max(len(loads) // 4, 1):]
        results["arms"]["quantile_frozen"] = {"load_max_over_mean": loads, "last_quarter_mean": sum(tail) / len(tail),
                                              "wall_s": time.perf_counter() - t0}
        print(f"quantile_frozen load max/mean, mean of the last quarter: {sum(tail) / len(tail):.3f}", flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


def frozen_router_loads(data: PretrainData, profile: str, steps: int) -> list[float]:
    """max/mean per step with quantile balancing on stage 1's batches while no weight changes."""
    torch.manual_seed(0)
    stage = PretrainConfig(profile=profile, stage=1, steps=steps, balancing="quantile").resolved()
    model = K3Model(stage.model)
    optimizer = build_optimizer(model, stage.lr, weight_decay=0.0)
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    batches = StageBatches(data, stage.model, seq_len=stage.seq_len, batch_size=stage.batch_size, seed=0,
                           stage=1, clue_fraction=0.5, image_fraction=0.25)
    batches.pack(steps * stage.batch_size)
    return [train_step(model, optimizer, batches.batch(step), 1.0, "cpu")["moe/load_max_over_mean"]
            for step in range(steps)]


if __name__ == "__main__":
    main()
