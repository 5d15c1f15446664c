"""Post-training's held-out scoring, old way against new in the same run, interleaved per cell, with
a check that both give the same figures (timing aside):

- `sampled`: a policy scored as rl_specialist and mopd_student score it (one episode per task at
  temperature 1, the same generator seed) on rl_tasks cells' held-out tasks, with QAT's expert
  weights fake-quantized on every forward (the old rollout) against once per run
  (`k3model.train.qat.frozen_expert_weights`, what `rollout.TokenPolicy.run` does now);
- `plan`: sft_policy's evaluation of a policy on the profile's plan (greedy, every (domain, effort)
  cell), one `evaluate()` per cell with the weights quantized every forward (the old
  `evaluate_policy`) against `k3model.train.ladder.evaluate_policy` now (each effort's cells
  in one batched decode, frozen weights).

    OMP_NUM_THREADS=1 python benchmarks/recipes/posttrain_eval.py --policy CKPT --base BASE_CKPT --ladder ladder.json \
        --tokenizer tokenizer.json --cells general_tasks/max,general_agents/high,coding_agents/low --tasks 32 \
        --out benchmarks/results/posttrain/<date>_posttrain_eval_tiny_cpu.json

The budgets are the profile's evaluation budgets (k3model/train/recipes.py POSTTRAIN_SIZES). The machine is shared:
the ratio is the figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import traceback

from benchmarks.common import close_report, run_header, write_json

TIMING = ("seconds", "policy_tokens_per_s")


def _figures(metadata: dict) -> dict:
    return {k: v for k, v in metadata.items() if k not in TIMING}


@contextlib.contextmanager
def quantized_every_forward():
    """The rollout as it was: no frozen expert weights."""
    import k3model.train.rollout as rollout
    frozen = rollout.frozen_expert_weights
    rollout.frozen_expert_weights = lambda model: contextlib.nullcontext(model)
    try:
        yield
    finally:
        rollout.frozen_expert_weights = frozen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", required=True, help="a QAT policy checkpoint (sft_policy's)")
    ap.add_argument("--base", help="base_model's checkpoint, for the plan section (omitted: policy only)")
    ap.add_argument("--ladder", required=True, help="rl_tasks' ladder.json: each cell's held-out tasks")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--cells", default="general_tasks/max,general_agents/high,coding_agents/low")
    ap.add_argument("--tasks", type=int, default=32, help="held-out tasks per cell (the first ones)")
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t_start = time.perf_counter()
    report: dict = {"benchmark": "posttrain_eval", **run_header(), "args": vars(args)}
    error = None
    try:
        import envs
        from k3model.train.ladder import evaluate_policy, plan_tasks
        from k3model.train.recipes import POSTTRAIN_SIZES as SIZES, eval_plan, specialist_scoring
        from k3model.checkpoint import load_model
        from k3model.train.effort import effort_specs
        from datagen.tokenizer import load_tokenizer
        from k3model.train.evaluate import evaluate

        sizes = SIZES[args.profile]
        specs = effort_specs(sizes.eval_budgets)
        scoring = specialist_scoring(args.profile, 0)
        tokenizer = load_tokenizer(args.tokenizer)
        policy = load_model(args.policy)[0].eval()
        ladder = json.loads(open(args.ladder).read())["tasks"]
        rows, old_s, new_s, same = {}, 0.0, 0.0, True
        for cell in args.cells.split(","):
            tasks = [envs.generate(f, s) for f, s in ladder[cell]["eval"][: args.tasks]]
            effort = cell.split("/")[1]

            def score():
                return evaluate(policy, tokenizer, tasks, effort, samples=scoring.samples,
                                temperature=scoring.temperature, seed=scoring.seed, specs=specs).as_metadata()
            t0 = time.perf_counter()
            with quantized_every_forward():
                old = score()
            t1 = time.perf_counter()
            new = score()
            t2 = time.perf_counter()
            rows[cell] = {"episodes": len(tasks), "old_s": t1 - t0, "new_s": t2 - t1, "ratio": (t2 - t1) / (t1 - t0),
                          "same_figures": _figures(old) == _figures(new), "success_rate": new["success_rate"],
                          "mean_policy_tokens": new["mean_policy_tokens"]}
            old_s, new_s, same = old_s + t1 - t0, new_s + t2 - t1, same and rows[cell]["same_figures"]
            print(cell, rows[cell], flush=True)
        report["sampled"] = {"cells": rows, "old_s": old_s, "new_s": new_s, "ratio": new_s / old_s,
                             "same_figures": same}
        print("sampled", report["sampled"] | {"cells": len(rows)}, flush=True)

        plan = eval_plan(args.profile)
        models = {"sft_policy": policy, **({"base_model": load_model(args.base)[0].eval()} if args.base else {})}
        report["plan"] = {}
        for name, model in models.items():
            t0 = time.perf_counter()
            with quantized_every_forward():
                old = {f"{d}/{e}": evaluate(model, tokenizer, plan_tasks(plan, d), e, seed=plan.seed, specs=plan.specs(),
                                            max_episodes_per_batch=plan.max_episodes_per_batch).as_metadata()
                       for d in plan.domains for e in plan.efforts}
            t1 = time.perf_counter()
            new = evaluate_policy(model, tokenizer, plan)
            t2 = time.perf_counter()
            report["plan"][name] = {"cells": len(new), "old_s": t1 - t0, "new_s": t2 - t1, "ratio": (t2 - t1) / (t1 - t0),
                                    "same_figures": all(_figures(old[c]) == _figures(new[c]) for c in new),
                                    "success_rate": sum(f["success_rate"] for f in new.values()) / len(new)}
            print("plan", name, report["plan"][name], flush=True)
    except Exception:  # noqa: BLE001 - recorded in the report
        error = traceback.format_exc()
    return close_report(report, t_start, lambda: write_json(args.out, report), error)


if __name__ == "__main__":
    raise SystemExit(main())
