"""Claim 1 on the tiny profile (DESIGN.md §5): do later context stages answer clue questions at
distances where earlier stages fail? Trains the four stages through the library and scores every
stage's checkpoint on one held-out clue grid, scattered beside control, by distance bucket.

    # the four stages, as `make run` would train them (no Dagster), each from the previous checkpoint
    OMP_NUM_THREADS=1 python benchmarks/claim1_tiny.py train --data-home H --out-dir D
    # accuracy by distance bucket at one length for each stage's checkpoint
    OMP_NUM_THREADS=1 python benchmarks/claim1_tiny.py eval --data-home H --checkpoints D/stage1/final,... \\
        --length 2048 --pairs-per-cell 100 --out benchmarks/results/train/claim1_tiny_cpu.json

`--data-home` is a K3_HOME whose tiny data assets exist (`k3 run --select tokenizer,corpus,clue_data,
image_data`); the newest version of each is used, as in benchmarks/clue_probe.py. The eval grid is
rebuilt from the recorded clue config with `--pairs-per-cell` (scattered, control) pairs per
(length, bucket) cell on the held-out filler: 100 pairs put the standard error of an accuracy at
most 0.05 (p = 0.5). Answers are scored by teacher forcing (argmax at every answer token, as
k3model.pretrain_eval does), the rows of a cell batched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.clue_probe import newest_data
from datagen.clues import clue_eval_grid
from k3model.pretrain import PretrainConfig, load_pretrained, train


def train_stages(data_home: str, out_dir: str, steps: list[int] | None) -> list[dict]:
    data = newest_data(Path(data_home), "tiny")
    rows, init = [], None
    for stage in range(1, 5):
        t0 = time.perf_counter()
        cfg = PretrainConfig(profile="tiny", stage=stage, steps=steps[stage - 1] if steps else None)
        result = train(cfg, data, Path(out_dir) / f"stage{stage}", init_checkpoint=init,
                       log_fn=lambda step, m: print(json.dumps({"stage": stage, "step": step, **{
                           k: round(v, 4) for k, v in m.items() if k in ("train/main", "train/answer", "perf/tokens_per_s")}}),
                           flush=True))
        init = result.checkpoint_dir
        row = {"stage": stage, "checkpoint": str(result.checkpoint_dir), "wall_s": time.perf_counter() - t0,
               "tokens_seen": result.tokens_seen, **result.eval}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if "clue_acc" not in k}), flush=True)
        Path(out_dir, "stages.json").write_text(json.dumps(rows, indent=1))
    return rows


@torch.no_grad()
def cell_hits(model, prompts: list[list[int]], answers: list[list[int]], max_tokens: int = 16384) -> list[bool]:
    """Teacher-forced correctness of each (prompt, answer) row; rows of one length run as a batch."""
    hits = [False] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, (p, a) in enumerate(zip(prompts, answers)):
        by_len.setdefault(len(p) + len(a), []).append(i)
    for length, idx in by_len.items():
        per_batch = max(max_tokens // length, 1)
        for lo in range(0, len(idx), per_batch):
            chunk = idx[lo:lo + per_batch]
            ids = torch.tensor([prompts[i] + answers[i] for i in chunk])
            logits = model(ids).logits_BTV
            for row, i in enumerate(chunk):
                start, n = len(prompts[i]), len(answers[i])
                predicted = logits[row, start - 1:start - 1 + n].argmax(-1)
                hits[i] = bool((predicted == torch.tensor(answers[i])).all())
    return hits


def evaluate_stages(data_home: str, checkpoints: list[str], length: int, pairs: int) -> dict:
    data = newest_data(Path(data_home), "tiny")
    clues = replace(data.clues, context_lengths=(length,), eval_per_cell=pairs)
    grid = clue_eval_grid(clues, tokenizer=data.tokenizer, corpus=data.corpus)
    cols = {c: grid.column(c).to_pylist() for c in ("bucket_lo", "bucket_hi", "variant", "prompt_ids",
                                                    "answer_ids", "distance")}
    out = {"length": length, "pairs_per_cell": pairs, "clue_config": str(clues), "stages": []}
    for stage, path in enumerate(checkpoints, start=1):
        model, _ = load_pretrained(path)
        model.eval()
        t0 = time.perf_counter()
        hits = cell_hits(model, cols["prompt_ids"], cols["answer_ids"])
        cells: dict[str, dict] = {}
        for i, ok in enumerate(hits):
            key = f"d{cols['bucket_lo'][i]}-{cols['bucket_hi'][i]}"
            cell = cells.setdefault(key, {"scattered": [], "control": []})
            cell[cols["variant"][i]].append(ok)
        row = {"stage": stage, "checkpoint": path, "eval_s": time.perf_counter() - t0, "buckets": {}}
        for key, cell in cells.items():
            row["buckets"][key] = {}
            for variant, v in cell.items():
                p = sum(v) / len(v)
                row["buckets"][key][variant] = {"acc": p, "n": len(v), "stderr": math.sqrt(max(p * (1 - p), 1e-12) / len(v))}
        out["stages"].append(row)
        print(json.dumps({"stage": stage, **{k: {vv: round(x["acc"], 3) for vv, x in c.items()}
                                             for k, c in row["buckets"].items()}}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data-home", required=True)
    t.add_argument("--out-dir", required=True)
    t.add_argument("--steps", default=None, help="per-stage steps 'a,b,c,d' (default: the profile's)")
    e = sub.add_parser("eval")
    e.add_argument("--data-home", required=True)
    e.add_argument("--checkpoints", required=True, help="the stages' final checkpoint dirs, comma-separated, in order")
    e.add_argument("--length", type=int, default=2048)
    e.add_argument("--pairs-per-cell", type=int, default=100)
    e.add_argument("--out", required=True)
    args = ap.parse_args()
    meta = {"threads": torch.get_num_threads(), "load_avg_1min_start": os.getloadavg()[0],
            "versions": {"torch": torch.__version__, "python": platform.python_version()}}
    if args.cmd == "train":
        train_stages(args.data_home, args.out_dir, [int(x) for x in args.steps.split(",")] if args.steps else None)
        return
    result = evaluate_stages(args.data_home, args.checkpoints.split(","), args.length, args.pairs_per_cell)
    Path(args.out).write_text(json.dumps({**meta, **result}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
