"""The rl_tasks ladder's wall time at a profile's sizes, split into its parts (issue 40 item 3).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/recipes/ladder_cost.py --policy SFT_CHECKPOINT \
        --tokenizer TOKENIZER_JSON --profile tiny --out benchmarks/results/posttrain/DATE_ladder_cost.json

`ladder.measure_ladder` on the policy with the profile's ladder and split sizes and eval budgets
(`recipes.POSTTRAIN_SIZES`), as the rl_tasks asset calls it: the model's part (G samples at T = 1
per task, plus, where the library has them, one greedy episode per task) timed apart from the random
and expert policies' episodes on each cell's splits. Run it with `PYTHONPATH=<another checkout>` to
time that checkout's ladder on the same policy: fields its `LadderConfig` lacks are left out, and
the JSON says which parts it has. Writes the figures, the selection and the header.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

import k3model.train.ladder as ladder
from benchmarks.common import run_header
from datagen.tokenizer import load_tokenizer
from k3model.checkpoint import load_model
from k3model.train.effort import effort_specs
from k3model.train.recipes import POSTTRAIN_SIZES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", required=True, help="an SFT policy checkpoint directory")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--profile", default="tiny", choices=sorted(POSTTRAIN_SIZES))
    ap.add_argument("--efforts", default=None, help="comma-separated; default every effort")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sizes = POSTTRAIN_SIZES[args.profile]
    have = {f.name for f in dataclasses.fields(ladder.LadderConfig)}
    wanted = {"tasks_per_family": sizes.ladder_tasks_per_family, "samples": sizes.ladder_samples,
              "k": min(8, sizes.ladder_samples), "rl_tasks_per_family": sizes.rl_tasks_per_family,
              "heldout_tasks_per_family": sizes.rl_eval_tasks_per_family, "hard_tasks": sizes.rl_hard_tasks,
              "baseline_tasks_per_family": 0}
    if sizes.sft_families is not None:
        wanted["families"] = sizes.sft_families
    if args.efforts:
        wanted["efforts"] = tuple(args.efforts.split(","))
    cfg = ladder.LadderConfig(**{k: v for k, v in wanted.items() if k in have})
    model = load_model(args.policy)[0].eval()
    tok = load_tokenizer(args.tokenizer)
    out: dict = {"header": run_header(), "library": ladder.__file__, "policy": args.policy, "profile": args.profile,
                 "threads": torch.get_num_threads(), "config": dataclasses.asdict(cfg),
                 "parts": ["sampled"] + (["greedy"] if "k" in have else [])}
    t0 = time.perf_counter()
    report = ladder.measure_ladder(model, tok, cfg, specs=effort_specs(sizes.eval_budgets))
    out["model_seconds"] = time.perf_counter() - t0
    if hasattr(report, "measure_baselines"):
        default = ladder.LadderConfig().baseline_tasks_per_family
        report.config = dataclasses.replace(cfg, baseline_tasks_per_family=default)
        t0 = time.perf_counter()
        report.measure_baselines()
        out["baseline_seconds"] = time.perf_counter() - t0
        out["parts"].append("baselines")
        out["baseline_table"] = report.baseline_table()
    out["seconds"] = out["model_seconds"] + out.get("baseline_seconds", 0.0)
    out["ladder"] = report.to_json()
    out["table"] = report.table()
    print(out["table"], "\n", out.get("baseline_table", ""), f"\nmodel {out['model_seconds']:.1f} s, baselines "
          f"{out.get('baseline_seconds', 0.0):.1f} s", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
