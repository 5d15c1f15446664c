"""The CPU training step of this tree's K3 model against another revision's, and both against the
dense peer, in one process and in turns (issue 17).

    OMP_NUM_THREADS=1 python benchmarks/model/train_step_ab.py --against 6b702ce --reps 15 \
        --out benchmarks/results/train/2026-12-01_train_step_ab_tiny_cpu.json

On the shared 2-core machine a K3/dense ratio moves by ±0.05 from one run of
`benchmarks/model/train_step.py` to the next as other work comes and goes, more than most single changes
gain; a change measured by two such runs is lost in that noise. Here the old model, the new one and
the dense peer take steps in turns (old, new, dense, old, …; median of `--reps`), so load falls on
all three alike, and `new_over_old` resolves a few percent. The other revision's `k3model` and
`kernels` packages are extracted by `git archive` into a temporary folder and imported under their own
names for the old model's construction only (its modules keep their own references afterwards; the
new code's modules are put back in `sys.modules`). Each model steps with its own revision's
`build_optimizer` (what that revision's trainers run), the dense peer with fused AdamW. Same shapes,
seed and step as train_step.py: random tokens, no MTP or vision (speed, not learning).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace

import torch

from benchmarks.common import dense_cpu_step, k3_train_step, run_header, time_interleaved

PACKAGES = ("k3model", "kernels")


def _own_modules() -> dict:
    return {name: mod for name, mod in sys.modules.items() if name.split(".")[0] in PACKAGES}


def model_class_at(rev: str, workdir: str):
    """(K3Model, get_profile, build_optimizer) as revision `rev` of this repository defines them."""
    subprocess.run(f"git archive {rev} {' '.join(PACKAGES)} | tar -x -C {workdir}", shell=True, check=True)
    current = _own_modules()
    for name in current:
        del sys.modules[name]
    sys.path.insert(0, workdir)
    try:
        from k3model.config import get_profile
        from k3model.model import K3Model
        from k3model.train.common import build_optimizer
    finally:
        sys.path.remove(workdir)
        for name in _own_modules():
            del sys.modules[name]
        sys.modules.update(current)
    return K3Model, get_profile, build_optimizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the git revision to compare with (e.g. HEAD~1)")
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--lengths", default="64,512")
    ap.add_argument("--tokens-per-step", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from k3model.config import get_profile
    from k3model.model import K3Model
    from k3model.train.common import build_optimizer

    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", *PACKAGES], capture_output=True, text=True).stdout)
    results = {"header": run_header(), "profile": args.profile, "new": revision + ("+changes" if dirty else ""), "old": args.against,
               "threads": torch.get_num_threads(), "load_avg_1min_start": os.getloadavg()[0],
               "timing": f"median of {args.reps} steps taken in turns (old, new, dense)",
               "optimizers": "each revision's build_optimizer; the dense peer's AdamW fused", "rows": []}
    no_autocast = lambda: torch.autocast("cpu", enabled=False)  # noqa: E731
    with tempfile.TemporaryDirectory() as workdir:
        old = model_class_at(args.against, workdir)
        for T in (int(x) for x in args.lengths.split(",")):
            B = max(args.tokens_per_step // T, 1)
            ids = torch.randint(0, get_profile(args.profile).model.vocab_size, (B, T))
            steps = {}
            for name, (cls, profiles, optimizer) in (("old", old), ("new", (K3Model, get_profile, build_optimizer))):
                cfg = replace(profiles(args.profile).model, vision=None, mtp_depth=0)
                torch.manual_seed(0)
                model = cls(cfg)
                # The optimizer as that revision's trainers build it.
                opt = optimizer(model, lr=1e-4, weight_decay=0.1)
                steps[name] = (lambda m, o: lambda: k3_train_step(m, o, ids, no_autocast))(model, opt)
            steps["dense"], _ = dense_cpu_step(args.profile, ids)
            dts = time_interleaved(steps, args.warmup, args.reps)
            row = {"seq_len": T, "batch": B, **{f"{k}_tokens_per_s": B * T / v for k, v in dts.items()}}
            row["old_over_dense"] = row["old_tokens_per_s"] / row["dense_tokens_per_s"]
            row["new_over_dense"] = row["new_tokens_per_s"] / row["dense_tokens_per_s"]
            row["new_over_old"] = row["new_tokens_per_s"] / row["old_tokens_per_s"]
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            results["rows"].append(row)
    results["load_avg_1min_end"] = os.getloadavg()[0]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
