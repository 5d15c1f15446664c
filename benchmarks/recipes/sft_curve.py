"""How many SFT steps the tiny policy needs: competence on held-out demonstrations against steps.

    python benchmarks/recipes/sft_curve.py --base BASE_CHECKPOINT_DIR --tokenizer TOKENIZER_JSON \
        --tasks 32 --steps 800 --every 100 --out benchmarks/results/posttrain/DATE_sft_curve.json

Builds `datagen.sft` demonstrations (`--tasks` per family, seed 0) and held-out ones (seed 1: other
tasks), trains `k3model.train.sft.train` from the base checkpoint (QAT on, as sft_policy does) in
slices of `--every` steps (exact resume between slices, so the run is one run), and after each
slice measures `sft.demo_loss` on the held-out rows: own-token loss, `p_demo` (the probability that
a temperature-1 sample replays the demonstration: a floor of sampled success) and `greedy_match`
(greedy decoding replays it: a floor of greedy success), per (domain, effort). Episodes are not
played: this is the cheap curve that says where to spend steps; `benchmarks/recipes/sft_sweep.py` plays the
ladder. Writes one JSON, rewritten after every slice.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import run_header
from datagen.sft import SFT_FAMILIES, SFTDataConfig, build_sft
from datagen.tokenizer import load_tokenizer
from k3model.checkpoint import load_model
from k3model.train.sft import Demonstrations, SFTConfig, demo_loss, train


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="base_model checkpoint directory")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--families", default="+".join(SFT_FAMILIES), help="+-joined task families")
    ap.add_argument("--tasks", type=int, default=32, help="demonstrated tasks per family")
    ap.add_argument("--heldout-tasks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--work", default="/tmp/sft_curve")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.steps % args.every:
        raise SystemExit("--steps must be a multiple of --every")
    tok = load_tokenizer(args.tokenizer)
    families = tuple(args.families.split("+"))
    t0 = time.perf_counter()
    data_cfg = SFTDataConfig(tasks_per_family=args.tasks, families=families)
    table, heldout = build_sft(data_cfg, tok), build_sft(replace(data_cfg, seed=1, tasks_per_family=args.heldout_tasks), tok)
    out: dict = {"header": run_header(), "args": vars(args), "rows": table.num_rows, "heldout_rows": heldout.num_rows,
                 "data_s": time.perf_counter() - t0, "threads": torch.get_num_threads(),
                 "device": "cuda" if torch.cuda.is_available() else "cpu", "curve": []}
    cfg = SFTConfig(profile="tiny", steps=args.steps, batch_size=args.batch, lr=args.lr, qat=True,
                    ckpt_every=args.every, log_every=args.every)
    work = Path(args.work)
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"--work {work} is not empty: a run there would resume from its checkpoint")
    held = None
    t_train = 0.0
    for done in range(args.every, args.steps + 1, args.every):
        t0 = time.perf_counter()
        result = train(cfg, table, work, init_checkpoint=args.base,
                       stop_after=args.every if done < args.steps else None)
        t_train += time.perf_counter() - t0
        model, _ = load_model(result.checkpoint_dir, out["device"])  # QAT back on, as trained
        held = held or Demonstrations(heldout, model.cfg.vocab_size)
        m = demo_loss(model, held, args.batch, out["device"])
        point = {"step": done, "train_s": t_train, "train_loss": result.history[-1].get("train/main") if result.history else None,
                 **{k: v for k, v in m.items() if "harness" not in k}}
        out["curve"].append(point)
        print(f"step {done} ({t_train:.0f} s): held-out loss {m['eval/loss']:.3f}, p_demo {m['eval/p_demo']:.3f}, "
              f"greedy_match {m['eval/greedy_match']:.3f}; " + ", ".join(
                  f"{k.split('/', 2)[2]} {v:.2f}" for k, v in m.items() if k.startswith("eval/greedy_match/") and
                  k.count("/") == 3), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
