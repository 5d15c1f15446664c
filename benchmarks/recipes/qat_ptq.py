"""Claim 5 at tiny scale: k3model.train.quant_compare.compare_qat_ptq on the SFT step (QAT from
step 1, bf16 then PTQ, bf16 then a short QAT), FLOOR and RCEIL, judged on held-out demonstrations.

    OMP_NUM_THREADS=1 python benchmarks/recipes/qat_ptq.py --base BASE_CKPT --demos sft.parquet \
        --heldout heldout.parquet --steps 40 --out benchmarks/results/mx/<date>_qat_vs_ptq_tiny_sft_cpu.json
"""

import argparse
import json
import time
from pathlib import Path

from benchmarks.common import run_header
from k3model.train.quant_compare import compare_qat_ptq
from k3model.train.sft import SFTConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the checkpoint SFT starts from")
    ap.add_argument("--demos", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--work", default="/tmp/qat_ptq")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.time()
    r = compare_qat_ptq(SFTConfig(profile="tiny", steps=args.steps, batch_size=args.batch_size, lr=1e-3,
                                  log_every=args.steps), args.demos, args.heldout, args.work, args.base,
                        log_fn=lambda arm, m: print(round(time.time() - t0), arm, m, flush=True))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"header": run_header(), "steps": args.steps, "wall_s": time.time() - t0, "arms": r.arms,
                                          "reference_loss": r.reference_loss, "tokens": r.tokens}, indent=1) + "\n")


if __name__ == "__main__":
    main()
