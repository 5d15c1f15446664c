"""Which decode path makes a policy's logits non-finite: the rl_tasks ladder's first evaluation (every
family, temperature 1) of a home's sft_policy, played three ways on one device —

    captured   the rollouts' own path on CUDA: bf16 autocast, the captured decode step (engine.GraphStep)
    eager      bf16 autocast, the same steps run eagerly over a dynamic cache (SlotBatch graphed=False)
    fp32       no autocast, eager (what the CPU plays)

— each until it ends or raises the rollout's FloatingPointError (which names the forward: the observation
feed or a decode step). Found for small's rl_tasks on an H100 (docs/log/gpu.md, sessions 31–32): NaN
logits at turn 2 in 14 of 64 episodes. Captured only → the static cache or the graph; eager too → bf16
numerics of some layer; fp32 too → the weights.

    PYTHONPATH=$PWD python3 benchmarks/decode/nonfinite.py --home .k3/small --profile small \
        --tasks-per-family 2 --samples 4 --budget-scale 0.125 --out $OUT/nonfinite.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch

from benchmarks.common import run_header, write_json


def newest(path: Path, pattern: str) -> Path:
    found = sorted(path.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"nothing matches {path}/{pattern}: materialize it first (k3 run --select sft_policy)")
    return found[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--profile", default="small")
    ap.add_argument("--tasks-per-family", type=int, default=2)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--budget-scale", type=float, default=0.125)
    ap.add_argument("--efforts", nargs="+", default=["low", "high", "max"])
    ap.add_argument("--modes", nargs="+", choices=("captured", "eager", "fp32"), default=["captured", "eager", "fp32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import k3model.engine as engine
    import k3model.train.rollout as rollout
    from datagen.tokenizer import load_tokenizer
    from k3model.checkpoint import load_model
    from k3model.train.effort import DOMAINS, effort_specs, scaled_budgets
    from k3model.train.evaluate import evaluate
    from k3model.train.ladder import RL_SEED_BASE, domain_families, tasks_of
    from k3model.train.recipes import POSTTRAIN_SIZES

    home = Path(args.home)
    policy = newest(home / "checkpoints" / args.profile / "sft_policy", "*/manifest.json").parent
    tokenizer = load_tokenizer(newest(home / "data" / args.profile / "tokenizer", "*/tokenizer.json"))
    sizes = POSTTRAIN_SIZES[args.profile]
    specs = effort_specs(scaled_budgets(sizes.eval_budgets, args.budget_scale))
    families = [f for d in DOMAINS for f in (domain_families(d, sizes.sft_families) if sizes.sft_families
                                             else domain_families(d))]
    tasks = tasks_of(families, args.tasks_per_family, RL_SEED_BASE)
    model, _ = load_model(str(policy), args.device)
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    report = {"header": run_header(), "args": vars(args), "policy": str(policy), "weights_finite": finite,
              "families": families, "modes": {}}
    print(f"policy {policy}: weights finite {finite}; {len(tasks)} tasks × {args.samples} samples", flush=True)

    slot_init = engine.SlotBatch.__init__
    for mode in args.modes:
        # eager: SlotBatch runs the model's forward over a dynamic cache; fp32: no autocast either.
        def init(self, model, rows, graphed=None, _mode=mode):
            slot_init(self, model, rows, graphed=False if _mode != "captured" else graphed)
        engine.SlotBatch.__init__ = init
        autocast = rollout.autocast_for
        if mode == "fp32":
            rollout.autocast_for = lambda *a, **k: contextlib.nullcontext()
        row = {}
        try:
            for effort in args.efforts:
                t0 = time.perf_counter()
                try:
                    r = evaluate(model, tokenizer, tasks, effort, samples=args.samples, temperature=1.0, specs=specs)
                    row[effort] = {"ok": True, "seconds": time.perf_counter() - t0, "success": r.success_rate}
                except FloatingPointError as e:
                    row[effort] = {"ok": False, "seconds": time.perf_counter() - t0, "error": str(e)}
                print(mode, effort, json.dumps(row[effort]), flush=True)
        finally:
            engine.SlotBatch.__init__ = slot_init
            rollout.autocast_for = autocast
        report["modes"][mode] = row
        write_json(args.out, report)


if __name__ == "__main__":
    main()
