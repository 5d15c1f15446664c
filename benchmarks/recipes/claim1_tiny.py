"""Claim 1 on the tiny profile (DESIGN.md §5): do later context stages answer clue questions at
distances where earlier stages fail? Trains the four stages through the library, measures what a
clue evaluation costs, and scores every stage's checkpoint on one held-out clue grid, scattered
beside control, by distance bucket, then applies claim 1's test to the counts
(`k3model.train.pretrain_eval.clue_distance_cases`, the one the claims report judges with).

    # the four stages, as `make run` would train them (no Dagster), each from the previous checkpoint
    OMP_NUM_THREADS=1 python benchmarks/recipes/claim1_tiny.py train --data-home H --out-dir D
    # ms per clue row by length: today's per-row scoring (every position's logits) against the
    # pipeline's batched, answer-positions-only scoring, in alternating turns
    OMP_NUM_THREADS=1 python benchmarks/recipes/claim1_tiny.py cost --data-home H --checkpoint D/stage4/final \\
        --out benchmarks/results/train/<date>_claim1_cost_tiny_cpu.json
    # every stage's checkpoint on the grid the tiny profile now builds (datagen/profiles.py), and claim 1
    OMP_NUM_THREADS=1 python benchmarks/recipes/claim1_tiny.py eval --data-home H --checkpoints S1,S2,S3,S4 \\
        --out benchmarks/results/train/<date>_claim1_tiny_cpu.json

`--data-home` is a K3_HOME whose tiny data assets exist (`k3 run --select tokenizer,corpus,clue_data,
image_data`); the newest version of each is used, as in benchmarks/recipes/clue_probe.py. `eval` rebuilds the
grid from the recorded clue config (its task, lengths and buckets) with the eval sizing of the tiny
preset (`eval_per_cell`, `eval_pairs_per_bucket`; override with `--per-cell`, `--per-bucket`) on the
held-out filler, and scores it with the pipeline's end-of-stage scorer
(`k3model.train.pretrain_eval.clue_accuracy`: argmax at every answer token, the rows of a cell batched).
The claim reads per (stage, bucket, variant) the hits and n summed over the bucket's cells.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import newest_data, run_header
from datagen import presets
from datagen.clues import clue_eval_grid, distance_buckets, home_cells, pairs_in_cell
from datagen.io import write_parquet
from k3model.checkpoint import load_model
from k3model.train.pretrain import PretrainConfig, train
from k3model.train.pretrain_eval import (answer_is_argmax, answers_are_argmax, clue_accuracy, clue_distance_cases,
                                         CLUE_BATCH_TOKENS)
from k3model.train.stats import wilson


LOGGED = ("train/main", "train/answer", "train/rest", "train/grad_norm", "train/lr", "perf/tokens_per_s")


def train_stages(data_home: str, out_dir: str, steps: list[int] | None, stages: int = 4, seed: int = 0,
                 eval_max_length: int | None = None, mixed_lr: float | None = None,
                 probe_step: int | None = None, first_stage: int = 1, init: str | None = None,
                 clue_warmup_steps: int | None = None) -> list[dict]:
    """The first `stages` stages, each from the previous one's checkpoint. `mixed_lr` overrides stage
    1's lr after its clue warmup (0: one schedule over the whole stage, the recipe before
    StageConfig.mixed_lr) and `clue_warmup_steps` its clue-only steps; `eval_max_length` cuts each stage's own clue evaluation short.
    `probe_step`: stage 1 stops after that many steps, its checkpoint there is scored on the clue grid
    (to `eval_max_length`), and the stage resumes (exactly: the checkpoint holds the train state).
    `first_stage` > 1 starts there from the checkpoint `init` (the stage before's final)."""
    data = newest_data(Path(data_home), "tiny")
    rows = []
    for stage in range(first_stage, stages + 1):
        t0 = time.perf_counter()
        cfg = PretrainConfig(profile="tiny", stage=stage, seed=seed, steps=steps[stage - 1] if steps else None,
                             eval_max_length=eval_max_length, mixed_lr=mixed_lr if stage == 1 else None,
                             clue_warmup_steps=clue_warmup_steps if stage == 1 else None)
        log_fn = (lambda step, m: print(json.dumps({"stage": stage, "step": step, **{
            k: round(v, 6 if k == "train/lr" else 4) for k, v in m.items() if k in LOGGED}}), flush=True))
        if stage == 1 and probe_step:
            cfg = replace(cfg, ckpt_every=probe_step)
            train(cfg, data, Path(out_dir) / "stage1", log_fn=log_fn, stop_after=probe_step)
            model, _ = load_model(Path(out_dir) / "stage1" / "last")
            probe = clue_accuracy(model, data, "cpu", examples_per_cell=None, max_length=eval_max_length)
            print(json.dumps({"stage": 1, "probe_step": probe_step, **{
                k: round(v, 4) for k, v in probe.items() if k.count("/") == 3 and "/len" not in k}}), flush=True)
            Path(out_dir, f"stage1_probe_{probe_step}.json").write_text(json.dumps(probe, indent=1))
        result = train(cfg, data, Path(out_dir) / f"stage{stage}", init_checkpoint=init, log_fn=log_fn)
        init = result.checkpoint_dir
        row = {"stage": stage, "checkpoint": str(result.checkpoint_dir), "wall_s": time.perf_counter() - t0,
               "tokens_seen": result.tokens_seen, **result.eval}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if "clue_" not in k}), flush=True)
        Path(out_dir, "stages.json").write_text(json.dumps(rows, indent=1))
    return rows


def measure_cost(data_home: str, checkpoint: str, rows_per_length: int, repeats: int) -> dict:
    """ms per clue row at each grid length: per row with every position's logits (the scorer before
    this change) and batched with the head at the answer positions only, in alternating turns."""
    data = newest_data(Path(data_home), "tiny")
    grid = data.clue_eval.to_pydict()
    model, _ = load_model(checkpoint)
    model.eval()
    out = {}
    for length in sorted(set(grid["length_target"])):
        idx = [i for i, n in enumerate(grid["length_target"]) if n == length]
        # Long rows cost seconds each: fewer of them (a quarter at 2048 tokens, two at 8192).
        idx = idx[:max(rows_per_length * 512 // max(length, 512), 2)]
        prompts, answers = [grid["prompt_ids"][i] for i in idx], [grid["answer_ids"][i] for i in idx]
        per_batch = max(CLUE_BATCH_TOKENS // (len(prompts[0]) + len(answers[0])), 1)
        times: dict[str, list[float]] = {"per_row_full_logits": [], "batched_answer_only": []}
        agree = True
        scorers = {
            "per_row_full_logits": lambda: [answer_is_argmax(model, p, a, "cpu") for p, a in zip(prompts, answers)],
            "batched_answer_only": lambda: [
                ok for s in range(0, len(idx), per_batch)
                for ok in answers_are_argmax(model, prompts[s:s + per_batch], answers[s:s + per_batch], "cpu")],
        }
        hits = {}
        for r in range(repeats):
            # Alternate which scorer goes first, so neither always runs on a warmer cache.
            for name in (list(scorers) if r % 2 == 0 else list(scorers)[::-1]):
                t0 = time.perf_counter()
                hits[name] = scorers[name]()
                times[name].append((time.perf_counter() - t0) / len(idx))
            agree &= hits["per_row_full_logits"] == hits["batched_answer_only"]
        best = {k: min(v) * 1e3 for k, v in times.items()}
        out[str(length)] = {"rows": len(idx), "batch_rows": per_batch, "ms_per_row_min": best,
                            "ms_per_row_all": {k: [t * 1e3 for t in v] for k, v in times.items()},
                            "speedup": best["per_row_full_logits"] / best["batched_answer_only"],
                            "same_hits": agree}
        print(length, json.dumps(out[str(length)]["ms_per_row_min"]), f"x{out[str(length)]['speedup']:.2f}",
              "same hits" if agree else "HITS DIFFER", flush=True)
    return out


def stage_counts(ev: dict[str, float]) -> dict[str, dict[str, tuple[float, int]]]:
    """{variant: {"lo-hi": (hits, n)}} from `clue_accuracy`'s bucket keys and their counts."""
    out: dict[str, dict[str, tuple[float, int]]] = {}
    for key, acc in ev.items():
        parts = key.split("/")
        if parts[:2] == ["eval", "clue_acc"] and len(parts) == 4 and parts[3].startswith("d"):
            n = int(ev[key.replace("clue_acc", "clue_n")])
            out.setdefault(parts[2], {})[parts[3][1:]] = (round(acc * n), n)
    return out


def evaluate_stages(data_home: str, checkpoints: list[str], per_cell: int | None,
                    per_bucket: tuple[int, ...] | None, lengths: tuple[int, ...] | None = None) -> dict:
    data = newest_data(Path(data_home), "tiny")
    tiny = presets("tiny").clues
    clues = replace(data.clues, eval_per_cell=per_cell or tiny.eval_per_cell,
                    eval_pairs_per_bucket=per_bucket or tiny.eval_pairs_per_bucket,
                    context_lengths=lengths or data.clues.context_lengths)
    grid = clue_eval_grid(clues, tokenizer=data.tokenizer, corpus=data.corpus)
    buckets = distance_buckets(clues)
    cells = {f"len{length}/d{buckets[b][0]}-{buckets[b][1]}": pairs_in_cell(clues, length, b)
             for length, b in sorted({(l, b) for l, b in zip(grid.column("length_target").to_pylist(),
                                                            grid.column("bucket").to_pylist())})}
    out = {"clue_config": {"eval_per_cell": clues.eval_per_cell, "eval_pairs_per_bucket": clues.eval_pairs_per_bucket,
                           "context_lengths": clues.context_lengths, "distance_edges": clues.distance_edges},
           "home_cells": {f"d{buckets[b][0]}-{buckets[b][1]}": length for b, length in home_cells(clues).items()},
           "pairs_per_cell": cells, "grid_rows": grid.num_rows, "stages": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "clue_eval.parquet"
        write_parquet(grid, path)
        scored = replace(data, clue_eval_path=path, clues=clues)
        stages = {}
        for stage, ckpt in enumerate(checkpoints, start=1):
            model, manifest = load_model(ckpt)
            t0 = time.perf_counter()
            ev = clue_accuracy(model, scored, "cpu", examples_per_cell=1 << 30, max_length=None)
            seconds = time.perf_counter() - t0
            stages[stage] = stage_counts(ev)
            row = {"stage": stage, "checkpoint": ckpt, "sha256": manifest.get("sha256"), "clue_eval_s": seconds,
                   "buckets": {b: {v: {"hits": h, "n": n, "acc": h / n, "wilson95": wilson(h, n)}
                                   for v, (h, n) in ((v, stages[stage][v][b]) for v in ("scattered", "control"))}
                               for b in stages[stage]["scattered"]},
                   "eval": ev}
            out["stages"].append(row)
            print(json.dumps({"stage": stage, "clue_eval_s": round(seconds, 1),
                              **{b: {v: f"{c['hits']}/{c['n']}" for v, c in cell.items()}
                                 for b, cell in row["buckets"].items()}}), flush=True)
    # Claim 1's test on the counts: pass when some (bucket, earlier stage, later stage) case has the
    # intervals apart where the earlier stage's control twins show it fails for distance.
    table, cases = clue_distance_cases(stages)
    out["claim_1"] = {"status": "pass" if cases else "fail" if len(stages) > 1 else "not measured (one stage)",
                      "cases": [{"bucket": b, "earlier": i, "later": j, "gap": gap} for b, i, j, gap in cases],
                      "by_distance": {b: {str(s): r for s, r in row.items()} for b, row in table.items()}}
    print(f"claim 1 {out['claim_1']['status']}: {len(cases)} (bucket, earlier, later) case(s) with the intervals apart",
          *(f"d{b}: stage {j} over stage {i} by {gap:+.2f}" for b, i, j, gap in cases), sep="\n  ", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data-home", required=True)
    t.add_argument("--out-dir", required=True)
    t.add_argument("--steps", default=None, help="per-stage steps 'a,b,c,d' (default: the profile's)")
    t.add_argument("--stages", type=int, default=4, help="train stages 1 … N (default 4)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--eval-max-length", type=int, default=None,
                   help="longest clue-eval length each stage scores (default: every length)")
    t.add_argument("--mixed-lr", type=float, default=None,
                   help="stage 1's peak lr after its clue warmup (default: the profile's; 0: one schedule)")
    t.add_argument("--probe-step", type=int, default=None,
                   help="score stage 1's checkpoint at this step on the clue grid, then go on")
    t.add_argument("--clue-warmup-steps", type=int, default=None, help="stage 1's clue-only steps (default: the profile's)")
    t.add_argument("--first-stage", type=int, default=1, help="start at this stage (from --init)")
    t.add_argument("--init", default=None, help="the checkpoint --first-stage starts from")
    c = sub.add_parser("cost")
    c.add_argument("--data-home", required=True)
    c.add_argument("--checkpoint", required=True)
    c.add_argument("--rows", type=int, default=32, help="rows per length (fewer at the long lengths)")
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--out", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--data-home", required=True)
    e.add_argument("--checkpoints", required=True, help="the stages' final checkpoint dirs, comma-separated, in order")
    e.add_argument("--per-cell", type=int, default=None, help="pairs per cell (default: the tiny preset's)")
    e.add_argument("--per-bucket", default=None, help="pairs per bucket's home cell, comma-separated "
                   "(default: the tiny preset's)")
    e.add_argument("--lengths", default=None, help="score only these grid lengths, comma-separated "
                   "(default: all; with one length every bucket is homed there)")
    e.add_argument("--out", required=True)
    args = ap.parse_args()
    meta = {"header": run_header(), "command": " ".join(sys.argv), "threads": torch.get_num_threads(),
            "load_avg_1min_start": os.getloadavg()[0]}
    if args.cmd == "train":
        train_stages(args.data_home, args.out_dir, [int(x) for x in args.steps.split(",")] if args.steps else None,
                     args.stages, args.seed, args.eval_max_length, args.mixed_lr, args.probe_step,
                     args.first_stage, args.init, args.clue_warmup_steps)
        return
    t0 = time.perf_counter()
    if args.cmd == "cost":
        result = {"checkpoint": args.checkpoint, "lengths": measure_cost(args.data_home, args.checkpoint,
                                                                         args.rows, args.repeats)}
    else:
        per_bucket = tuple(int(x) for x in args.per_bucket.split(",")) if args.per_bucket else None
        lengths = tuple(int(x) for x in args.lengths.split(",")) if args.lengths else None
        result = evaluate_stages(args.data_home, args.checkpoints.split(","), args.per_cell, per_bucket, lengths)
    meta["wall_s"] = time.perf_counter() - t0
    meta["load_avg_1min_end"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({**meta, **result}, indent=1, default=list))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
