"""Claim 5 where quantization matters: k3model.train.quant_compare.compare_scope (per seed, SFT
without quantization then PTQ, against QAT from step 1, at a quantization scope, each scale
rounding), judged on held-out windows; with the wall time of the whole comparison (what
quantized_student adds to `make run`).

    OMP_NUM_THREADS=1 python benchmarks/recipes/qat_scope.py --base BASE_CKPT --demos sft.parquet \
        --heldout heldout.parquet --steps 120 --out benchmarks/results/mx/<date>_qat_scope_tiny_cpu.json
"""

import argparse
import json
import time
from pathlib import Path

from benchmarks.common import run_header
from datagen.io import read_parquet
from k3model.train.quant_compare import compare_scope, token_windows
from k3model.train.sft import SFTConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the checkpoint SFT starts from")
    ap.add_argument("--demos", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--scope", default="all_linear")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--roundings", nargs="+", default=["ceil", "floor"])
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--window-len", type=int, default=512)
    ap.add_argument("--work", default="/tmp/qat_scope")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.time()
    windows_NT = token_windows(read_parquet(args.heldout), args.window_len, args.windows)
    r = compare_scope(SFTConfig(profile=args.profile, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                log_every=args.steps), args.demos, windows_NT, args.work, args.base,
                      scope=args.scope, seeds=args.seeds, scale_roundings=args.roundings,
                      log_fn=lambda arm, m: print(round(time.time() - t0), arm, m, flush=True))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"header": run_header(), "args": vars(args), "wall_s": time.time() - t0,
                                          **r}, indent=1) + "\n")


if __name__ == "__main__":
    main()
