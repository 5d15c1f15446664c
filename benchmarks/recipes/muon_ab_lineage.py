"""AdamW vs Per-Head Muon through a profile's whole pretraining lineage (stages 1–4, the profile's own
steps, shapes, clue warmup and schedules): each arm is `k3 run --select <data>,pretrain_stage_1..4` in a
home of its own with `--set pretrain_stage_N.optimizer=… --set pretrain_stage_N.seed=…`, so it trains and
evaluates exactly as `make run` does; only the optimizer (and the seed) differs. What each stage's asset
recorded is then read back from the arm's Dagster instance: held-out perplexity, clue accuracy per
distance band at the stage's length, the last 10 % training loss, tokens/s and wall time.

    PYTHONPATH=$PWD python benchmarks/recipes/muon_ab_lineage.py --work /tmp/muon_ab_lineage \
        --arms adamw:0 muon:0 adamw:1 muon:1 --threads 1 --parallel 2
    ... --reuse muon:0=/path/to/a/make-run/home     # an arm a `make run` already trained (its home)
    ... --arms adamw:0 adamw:1 --set pretrain_stage_1.steps=1356 pretrain_stage_2.steps=285 \
        --work /tmp/muon_ab_wall --out <json>          # AdamW given the steps Muon's slower step buys

Arms run `--parallel` at a time, each with `--threads` torch threads (OMP_NUM_THREADS); tokens/s of arms
that ran side by side are comparable to each other, not to a quiet machine's. An arm whose home already
holds the four stages is read, not retrained (k3 run skips what is up to date). The JSON (rewritten after
each arm) goes to benchmarks/results/recipes/<date>_muon_ab_lineage_<profile>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import ROOT, run_header, write_json

DATA = ("tokenizer", "corpus", "clue_data", "image_data")
STAGES = (1, 2, 3, 4)
# What each stage's materialization carries that the A/B compares (assets/pretrain.py's metadata).
READ = r"""
import json, sys
from pipelines.instance import apply_k3_environ
apply_k3_environ()
import dagster as dg
inst = dg.DagsterInstance.get()
out = {}
for stage in (1, 2, 3, 4):
    key = dg.AssetKey([sys.argv[1], f"pretrain_stage_{stage}"])
    recs = inst.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1).records
    if not recs:
        continue
    meta = {k: v.value for k, v in recs[0].event_log_entry.asset_materialization.metadata.items()}
    stats = [s for s in inst.get_run_step_stats(recs[0].run_id) if s.step_key.endswith(f"pretrain_stage_{stage}")
             and s.start_time and s.end_time]
    meta["step_wall_s"] = stats[0].end_time - stats[0].start_time if stats else None
    out[stage] = meta
print(json.dumps(out, default=str))
"""


def parse_arm(text: str) -> tuple[str, int]:
    name, _, seed = text.partition(":")
    if name not in ("adamw", "muon") or not seed.isdigit():
        raise argparse.ArgumentTypeError(f"an arm is OPTIMIZER:SEED with OPTIMIZER adamw or muon, got {text!r}")
    return name, int(seed)


def train_arm(profile: str, optimizer: str, seed: int, home: Path, threads: int, log: Path,
              extra: tuple[str, ...] = ()) -> int:
    sets = [a for s in STAGES for a in ("--set", f"pretrain_stage_{s}.optimizer={optimizer}",
                                        "--set", f"pretrain_stage_{s}.seed={seed}")]
    sets += [a for e in extra for a in ("--set", e)]
    select = ",".join((*DATA, *(f"pretrain_stage_{s}" for s in STAGES)))
    env = dict(os.environ, K3_HOME=str(home), OMP_NUM_THREADS=str(threads), PYTHONPATH=ROOT)
    with open(log, "a") as f:
        return subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--profile", profile, "--select", select,
                               *sets], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode


def read_arm(profile: str, home: Path) -> dict:
    env = dict(os.environ, K3_HOME=str(home), PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", READ, profile], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"reading {home}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def figures(meta: dict) -> dict:
    """The compared figures of one stage's metadata (absent keys stay absent)."""
    keep = {}
    for k, v in meta.items():
        if k in ("eval/ppl", "train/final_loss", "train/first_loss", "perf/tokens_per_s", "perf/wall_s", "step_wall_s",
                 "steps", "tokens_seen", "moe/load_max_over_mean", "moe/heldout_load_max_over_mean",
                 "attn/max_logit") or k.startswith("eval/clue_acc/"):
            keep[k] = v
    # The stage's clue accuracy per distance band (its Markdown table: | distance | scattered | control | n |).
    for line in str(meta.get("clue_acc_by_distance", "")).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0][:1].isdigit():
            keep[f"eval/clue_acc/scattered/d{cells[0]}"] = float(cells[1])
            keep[f"eval/clue_acc/control/d{cells[0]}"] = float(cells[2])
            keep[f"eval/clue_n/d{cells[0]}"] = int(float(cells[3]))
    return keep


def summarize(arms: dict[str, dict]) -> dict:
    """Per stage: each optimizer's mean over seeds of held-out NLL (log ppl) and clue accuracy per band,
    and the paired (same seed) Muon − AdamW difference of the held-out NLL."""
    import math
    out = {}
    for stage in STAGES:
        by = {}
        for name, arm in arms.items():
            st = arm["stages"].get(stage)
            if st and "eval/ppl" in st:
                by.setdefault(arm["optimizer"], {})[arm["seed"]] = st
        if not by:
            continue
        row = {}
        for opt, seeds in by.items():
            row[opt] = {"seeds": sorted(seeds), "heldout_nll": statistics.mean(math.log(float(s["eval/ppl"]))
                                                                               for s in seeds.values())}
            bands = sorted({k for s in seeds.values() for k in s if k.startswith("eval/clue_acc/")})
            row[opt]["clue_acc"] = {b.split("/", 2)[2]: statistics.mean(float(s[b]) for s in seeds.values() if b in s)
                                    for b in bands}
            row[opt]["tokens_per_s"] = statistics.mean(float(s["perf/tokens_per_s"]) for s in seeds.values()
                                                       if "perf/tokens_per_s" in s) if any(
                "perf/tokens_per_s" in s for s in seeds.values()) else None
        paired = sorted(set(by.get("adamw", {})) & set(by.get("muon", {})))
        row["muon_minus_adamw_heldout_nll_per_seed"] = {
            s: math.log(float(by["muon"][s]["eval/ppl"])) - math.log(float(by["adamw"][s]["eval/ppl"])) for s in paired}
        out[stage] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="tiny", choices=("smoke", "tiny"),
                    help="a CPU profile (small's lineage is a GPU job: h200_calls.sh small)")
    ap.add_argument("--work", required=True, help="one home per arm under it: <work>/<optimizer>_s<seed>")
    ap.add_argument("--arms", nargs="+", type=parse_arm, default=[("adamw", 0), ("muon", 0), ("adamw", 1), ("muon", 1)])
    ap.add_argument("--reuse", nargs="*", default=[], help="ARM=HOME: read that arm from an existing home "
                    "(e.g. a make-run home for the profile's default optimizer at seed 0)")
    ap.add_argument("--set", dest="sets", nargs="*", default=[], metavar="ASSET.FIELD=VALUE",
                    help="more `k3 run --set`s for every trained arm, e.g. an equal-wall-time arm's "
                         "pretrain_stage_1.steps=1356 (the arms' homes and JSON are then its own: pass --work/--out)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads < 1 or args.parallel < 1:
        ap.error("--threads and --parallel must be ≥ 1")
    reuse = {}
    for item in args.reuse:
        arm, _, home = item.partition("=")
        if not home or not Path(home).is_dir():
            ap.error(f"--reuse takes ARM=HOME with HOME an existing directory, got {item!r}")
        reuse[parse_arm(arm)] = Path(home)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = args.out or str(Path(ROOT) / "benchmarks" / "results" / "recipes" /
                          f"{time.strftime('%Y-%m-%d')}_muon_ab_lineage_{args.profile}.json")
    report = {"header": run_header(), "args": vars(args) | {"arms": [f"{o}:{s}" for o, s in args.arms]}, "arms": {}}
    started = time.perf_counter()
    lock = threading.Lock()

    def one(arm: tuple[str, int]) -> None:
        optimizer, seed = arm
        name = f"{optimizer}_s{seed}"
        home = reuse.get(arm, work / name)
        t0 = time.perf_counter()
        rc = 0 if arm in reuse else train_arm(args.profile, optimizer, seed, home, args.threads, work / f"{name}.log",
                                                     tuple(args.sets))
        stages = read_arm(args.profile, home)
        with lock:
            report["arms"][name] = {"optimizer": optimizer, "seed": seed, "home": str(home), "rc": rc,
                                    "reused": arm in reuse, "wall_s": time.perf_counter() - t0,
                                    "stages": {s: figures(m) for s, m in stages.items()}}
            print(f"{name}: rc {rc}, {len(stages)} stages, {time.perf_counter() - t0:.0f} s", flush=True)
            report["summary"] = summarize(report["arms"])
            write_json(out, report)

    with ThreadPoolExecutor(args.parallel) as pool:
        for f in [pool.submit(one, arm) for arm in args.arms]:
            f.result()
    report["wall_s"] = time.perf_counter() - started
    report["summary"] = summarize(report["arms"])
    write_json(out, report)
    print(json.dumps(report["summary"], indent=1, default=str))


if __name__ == "__main__":
    main()
