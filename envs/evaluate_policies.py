"""Success rates of the scripted policies by task family and by harness.

    python -m envs.evaluate_policies --seeds 3 --out docs/envs_policy_table   # writes .json and .md

Policies: `expert` (the gold script), `baseline` (the script with a 15 % chance per turn of skipping
a step, envs/experts.py) and `random` (well-formed random calls). Each (family, harness, policy)
cell is the fraction of `--seeds` tasks (seeds 0..n-1) that end with reward 1. The JSON also holds
per-cell mean turns and the wall time of the run; the markdown has the two summary tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from envs import HARNESSES, list_envs, make_env
from envs.experts import baseline_policy, expert_policy, random_policy
from envs.rollout import rollout
from envs.tasks import get_family

POLICIES = ("expert", "baseline", "random")


def _policy(kind: str, family: str, harness: str, seed: int):
    if kind == "expert":
        return expert_policy(family, harness)
    if kind == "baseline":
        return baseline_policy(family, harness, seed=seed)
    if kind == "random":
        return random_policy(harness, seed=seed)
    raise ValueError(f"policy must be one of {POLICIES}, got {kind!r}")


def run_cell(family: str, harness: str, policy: str, seeds: int) -> dict:
    wins, turns = 0, 0
    for seed in range(seeds):
        with make_env(family, harness=harness) as env:
            rec = rollout(env, _policy(policy, family, harness, seed), seed=seed)
        wins += rec["reward"] >= 1.0
        turns += rec["usage"]["steps"]
    return {"family": family, "harness": harness, "policy": policy, "success": wins / seeds,
            "mean_turns": turns / seeds, "episodes": seeds}


def _code_version() -> str | None:
    """The git commit of this checkout (with "+dirty" if it has changes), or None outside git."""
    try:
        here = Path(__file__).parent
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here, capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def evaluate(families: list[str], harnesses: list[str], policies: list[str], seeds: int, jobs: int = 1) -> dict:
    start = time.time()
    jobs_list = [(f, h, p, seeds) for f in families for h in harnesses for p in policies]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            cells = list(pool.map(run_cell, *zip(*jobs_list)))
    else:
        cells = [run_cell(*j) for j in jobs_list]

    def mean(xs):
        return sum(xs) / len(xs) if xs else 0.0

    by_family = {}
    for f in families:
        fam = get_family(f)
        row = {"domain": fam.domain, "difficulty": fam.difficulty}
        for p in policies:
            row[p] = mean([c["success"] for c in cells if c["family"] == f and c["policy"] == p])
        row["expert_turns"] = mean([c["mean_turns"] for c in cells if c["family"] == f and c["policy"] == "expert"])
        by_family[f] = row
    by_harness = {h: {p: mean([c["success"] for c in cells if c["harness"] == h and c["policy"] == p])
                      for p in policies} for h in harnesses}
    return {
        "command": " ".join(["python -m envs.evaluate_policies"] + sys.argv[1:]),
        "seeds_per_cell": seeds,
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "code_version": _code_version(),
        "wall_seconds": round(time.time() - start, 1),
        "by_family": by_family,
        "by_harness": by_harness,
        "cells": cells,
    }


def to_markdown(result: dict) -> str:
    policies = [p for p in POLICIES if p in next(iter(result["by_harness"].values()))]
    lines = [f"Success rate (reward 1) over {result['seeds_per_cell']} seeds per family x harness "
             f"({result['wall_seconds']} s).", "",
             "| family | domain | difficulty | expert turns | " + " | ".join(policies) + " |",
             "|---|---|---|---:|" + "---:|" * len(policies)]
    for f, row in result["by_family"].items():
        lines.append(f"| {f} | {row['domain']} | {row['difficulty']} | {row['expert_turns']:.0f} | "
                     + " | ".join(f"{row[p]:.2f}" for p in policies) + " |")
    lines += ["", "| harness | " + " | ".join(policies) + " |", "|---|" + "---:|" * len(policies)]
    for h, row in result["by_harness"].items():
        lines.append(f"| {h} | " + " | ".join(f"{row[p]:.2f}" for p in policies) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="*", default=None, help="default: all of envs.list_envs()")
    ap.add_argument("--harnesses", nargs="*", default=list(HARNESSES))
    ap.add_argument("--policies", nargs="*", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    families = args.families or list_envs()
    result = evaluate(families, args.harnesses, args.policies, args.seeds, args.jobs)
    md = to_markdown(result)
    print(md)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
