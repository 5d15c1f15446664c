"""The task ladder and specialists against the SFT policy on tiny (issue 18 items 4 and 7).

    python benchmarks/recipes/posttrain_ladder.py --policy SFT_CHECKPOINT --tokenizer TOKENIZER_JSON \
        --cells general_tasks:low,general_tasks:max --out benchmarks/results/posttrain/DATE_ladder_tiny.json

1. `ladder.measure_ladder` on the SFT policy (8 samples per prompt, temperature 1).
2. For each cell: sft_policy on the held-out tasks of the cell's families (`LadderReport.eval_tasks`,
   one sample each at temperature 1), `grpo.train` on the cell's RL tasks, the specialist on the
   same held-out tasks; the hard split (`ladder.hard_tasks`) for the specialist's domain.
3. Tokens per effort: sft_policy on each cell's held-out tasks at low, high and max.
Writes one JSON (figures, configs, wall times); say in the log how loaded the machine was.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.common import run_header
from datagen.tokenizer import load_tokenizer
from k3model.checkpoint import load_model
from k3model.train.evaluate import evaluate
from k3model.train.grpo import GRPOConfig, train
from k3model.train.ladder import LadderConfig, hard_tasks, measure_ladder


def _fig(report) -> dict:
    lo, hi = report.ci95
    return {"success": report.success_rate, "n": report.n, "ci95": [lo, hi], "tokens": report.mean_policy_tokens,
            "unparseable": report.unparseable_rate, "per_family": report.per_family, "seconds": report.seconds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--cells", default="general_tasks:low,general_tasks:max")
    ap.add_argument("--ladder-tasks", type=int, default=3)
    ap.add_argument("--eval-tasks", type=int, default=24, help="held-out tasks per selected family")
    ap.add_argument("--steps", type=int, default=GRPOConfig().steps)
    ap.add_argument("--groups", type=int, default=GRPOConfig().groups_per_step)
    ap.add_argument("--lr", type=float, default=GRPOConfig().lr)
    ap.add_argument("--work", default="/tmp/posttrain_ladder")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    model, _ = load_model(args.policy)
    out: dict = {"header": run_header(), "policy": args.policy, "threads": torch.get_num_threads(), "cells": {}}

    t0 = time.perf_counter()
    ladder = measure_ladder(model, tok, LadderConfig(tasks_per_family=args.ladder_tasks))
    out["ladder"] = ladder.to_json()
    out["ladder_table"] = ladder.table()
    print(ladder.table(), f"\n{time.perf_counter() - t0:.0f} s", flush=True)

    for cell in args.cells.split(","):
        domain, effort = cell.split(":")
        held = ladder.eval_tasks(domain, effort, args.eval_tasks)
        rec: dict = {"selected": ladder.cell(domain, effort).selected}
        rec["sft"] = {e: _fig(evaluate(model, tok, held, e, temperature=1.0)) for e in ("low", "high", "max")}
        hard = hard_tasks(domain, args.eval_tasks)
        rec["sft_hard"] = {e: _fig(evaluate(model, tok, hard, e, temperature=1.0)) for e in ("low", "max")}
        cfg = GRPOConfig(steps=args.steps, groups_per_step=args.groups, lr=args.lr)
        t = time.perf_counter()
        result = train(cfg, args.policy, tok, Path(args.work) / f"{domain}_{effort}", domain=domain, effort=effort,
                       tasks=ladder.rl_tasks(domain, effort), log_fn=lambda s, m: print(cell, s, {
                           k: round(v, 3) for k, v in m.items() if isinstance(v, float) and k.startswith(
                               ("rl/success", "rl/frac_zero", "rl/tokens", "perf/", "train/loss", "rl/logp_diff_abs"))},
                           flush=True))
        rec["train_seconds"] = time.perf_counter() - t
        rec["grpo"] = {"config": asdict(cfg), "history": result.history, "metrics": result.metrics}
        spec_model, _ = load_model(result.checkpoint_dir)
        rec["specialist"] = _fig(evaluate(spec_model, tok, held, effort, temperature=1.0))
        rec["specialist_hard"] = _fig(evaluate(spec_model, tok, hard, effort, temperature=1.0))
        out["cells"][cell] = rec
        print(cell, "sft", rec["sft"][effort]["success"], "specialist", rec["specialist"]["success"],
              "n", rec["specialist"]["n"], flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    out["seconds"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
