"""mopd_student's held-out evaluation of the student, two ways in the same run, interleaved per effort:
one `evaluate()` per (domain, effort) cell (what the asset did until 2026-12-01) against
`k3model.train.mopd.evaluate_routes` (each effort's cells in one batched decode, what it does now).
Also checks that the two give the same figures on a real checkpoint (timing aside).

    OMP_NUM_THREADS=1 python benchmarks/recipes/mopd_eval.py --student CKPT --ladder ladder.json --tokenizer tokenizer.json \
        --out benchmarks/results/pipelines/<date>_mopd_eval_tiny_cpu.json

The budgets are the tiny profile's evaluation budgets (k3model/train/recipes.py POSTTRAIN_SIZES["tiny"].eval_budgets),
the ones the specialists were evaluated with. The machine is shared: the ratio is the figure.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

from benchmarks.common import close_report, run_header, write_json


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--student", required=True, help="a policy checkpoint (mopd_student's)")
    ap.add_argument("--ladder", required=True, help="rl_tasks' ladder.json: each cell's held-out tasks")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--profile", default="tiny", help="whose eval_budgets to use")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t_start = time.perf_counter()
    report: dict = {"benchmark": "mopd_eval", **run_header(), "args": vars(args)}
    error = None
    try:
        import envs
        from k3model.train.recipes import POSTTRAIN_SIZES as SIZES
        from k3model.train.effort import effort_specs
        from datagen.tokenizer import load_tokenizer
        from k3model.checkpoint import load_model
        from k3model.train.evaluate import evaluate
        from k3model.train.mopd import evaluate_routes

        specs = effort_specs(SIZES[args.profile].eval_budgets)
        tokenizer = load_tokenizer(args.tokenizer)
        model = load_model(args.student)[0].eval()
        ladder = json.loads(open(args.ladder).read())["tasks"]
        cells = {tuple(c.split("/")): [envs.generate(f, s) for f, s in v["eval"]] for c, v in ladder.items()}
        timing = ("seconds", "policy_tokens_per_s")
        rows = {}
        for effort in dict.fromkeys(e for _, e in cells):
            mine = {r: t for r, t in cells.items() if r[1] == effort}
            t0 = time.perf_counter()
            alone = {r: evaluate(model, tokenizer, t, effort, specs=specs).as_metadata() for r, t in mine.items()}
            per_cell_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            together = {r: rep.as_metadata() for r, rep in evaluate_routes(model, tokenizer, mine, specs).items()}
            batched_s = time.perf_counter() - t0
            same = all({k: v for k, v in alone[r].items() if k not in timing}
                       == {k: v for k, v in together[r].items() if k not in timing} for r in mine)
            rows[effort] = {"cells": len(mine), "episodes": sum(len(t) for t in mine.values()),
                            "per_cell_s": per_cell_s, "batched_s": batched_s, "ratio": batched_s / per_cell_s,
                            "same_figures": same,
                            "mean_policy_tokens": sum(a["mean_policy_tokens"] for a in alone.values()) / len(alone)}
            print(effort, rows[effort], flush=True)
        report["by_effort"] = rows
        total_old = sum(r["per_cell_s"] for r in rows.values())
        total_new = sum(r["batched_s"] for r in rows.values())
        report["total"] = {"per_cell_s": total_old, "batched_s": total_new, "ratio": total_new / total_old,
                           "same_figures": all(r["same_figures"] for r in rows.values())}
        print(report["total"], flush=True)
    except Exception:  # noqa: BLE001 - recorded in the report
        error = traceback.format_exc()
    return close_report(report, t_start, lambda: write_json(args.out, report), error)


if __name__ == "__main__":
    raise SystemExit(main())
