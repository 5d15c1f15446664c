"""How much SFT the tiny policy needs before the task ladder has cells in its band (issue 18 item 4).

    python benchmarks/recipes/sft_sweep.py --base BASE_CHECKPOINT_DIR --tokenizer TOKENIZER_JSON \
        --runs "8:60:4,64:300:8" --out benchmarks/results/posttrain/DATE_sft_sweep.json

Each run `tasks:steps:batch[:lr[:families]]` builds `datagen.sft` demonstrations with `tasks` tasks per
family (every training harness, three efforts; families a `+`-joined list, default SFT_FAMILIES),
trains `k3model.train.sft.train` from the base checkpoint (QAT on, as sft_policy does) and measures
`ladder.measure_ladder` on the result (`--ladder-tasks` RL-seed tasks per family, 8 samples,
temperature 1, every effort). The data of a (tasks, families) pair is built once. Writes one JSON:
per run the config, the SFT losses, the wall times and the ladder (per family and effort).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.common import run_header
from datagen.sft import SFT_FAMILIES, SFTDataConfig, build_sft
from datagen.tokenizer import load_tokenizer
from k3model.checkpoint import load_model
from k3model.train.effort import EFFORT_SPECS, EffortSpec
from k3model.train.ladder import LadderConfig, measure_ladder
from k3model.train.sft import SFTConfig, train


def parse_run(spec: str, default_lr: float) -> dict:
    parts = spec.split(":")
    if len(parts) < 3:
        raise ValueError(f"run {spec!r}: write tasks:steps:batch[:lr[:family+family…]]")
    families = tuple(parts[4].split("+")) if len(parts) > 4 and parts[4] else tuple(SFT_FAMILIES)
    return {"tasks": int(parts[0]), "steps": int(parts[1]), "batch": int(parts[2]),
            "lr": float(parts[3]) if len(parts) > 3 and parts[3] else default_lr, "families": families}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="base_model checkpoint directory")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--runs", required=True, help="comma-separated tasks:steps:batch[:lr[:families]]")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--ladder-tasks", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--budgets", default="low:256:128,high:512:192,max:1024:256",
                    help="effort:episode budget:turn cap (the tiny profile's eval_budgets, assets/posttrain.py)")
    ap.add_argument("--work", default="/tmp/sft_sweep")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    runs = [parse_run(s, args.lr) for s in args.runs.split(",")]
    specs = {e: EffortSpec(budget_tokens=int(b), length_coef=EFFORT_SPECS[e].length_coef, turn_tokens=int(t))
             for e, b, t in (x.split(":") for x in args.budgets.split(","))}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict = {"header": run_header(), "base": args.base, "budgets": args.budgets, "device": device, "threads": torch.get_num_threads(), "runs": []}
    data: dict = {}
    for i, r in enumerate(runs):
        key = (r["tasks"], r["families"])
        t0 = time.perf_counter()
        if key not in data:
            data[key] = build_sft(SFTDataConfig(tasks_per_family=r["tasks"], families=r["families"]), tok)
        table = data[key]
        t_data = time.perf_counter() - t0
        cfg = SFTConfig(profile="tiny", steps=r["steps"], batch_size=r["batch"], lr=r["lr"], qat=True,
                        log_every=max(r["steps"] // 10, 1))
        t0 = time.perf_counter()
        result = train(cfg, table, Path(args.work) / f"run{i}", init_checkpoint=args.base,
                       log_fn=lambda step, m: print(f"  step {step}: " + ", ".join(
                           f"{k} {v:.3g}" for k, v in m.items() if isinstance(v, float)), flush=True))
        t_train = time.perf_counter() - t0
        model, _ = load_model(result.checkpoint_dir, device=device)
        t0 = time.perf_counter()
        ladder = measure_ladder(model, tok, LadderConfig(tasks_per_family=args.ladder_tasks, samples=args.samples,
                                                         k=min(8, args.samples), families=r["families"]), specs=specs)
        t_ladder = time.perf_counter() - t0
        entry = {**r, "rows": table.num_rows, "data_s": t_data, "train_s": t_train, "ladder_s": t_ladder,
                 "metrics": result.metrics, "history": result.history[-3:], "ladder": ladder.to_json(),
                 "ladder_table": ladder.table()}
        out["runs"].append(entry)
        print(f"run {i} {r}: rows {table.num_rows}, data {t_data:.0f} s, train {t_train:.0f} s, "
              f"ladder {t_ladder:.0f} s, fit/loss {result.metrics.get('fit/loss')}\n{ladder.table()}", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=list))


if __name__ == "__main__":
    main()
