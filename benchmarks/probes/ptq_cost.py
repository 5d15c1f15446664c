"""What post-training quantization alone costs a trained checkpoint: held-out own-token loss and
KL(p_fp32 ‖ p_mxfp4) with the routed experts packed to MXFP4 (k3model.quantize.convert_to_mx, the
export's quantizer), under both scale roundings. Claim 5 (QAT halves PTQ's drop) needs a drop to halve.

    python benchmarks/probes/ptq_cost.py HELDOUT.parquet CKPT [CKPT ...] --out OUT.json

HELDOUT: a datagen.sft held-out table (sft_data's heldout.parquet); each CKPT a checkpoint directory
(base_model, sft_policy, mopd_student, ...). fp32 on the CPU, one thread.
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

from benchmarks.common import run_header
from datagen.io import read_parquet
from k3model.model import IGNORE_INDEX
from k3model.checkpoint import load_model
from k3model.quantize import convert_to_mx
from k3model.train import sft
from k3model.train.quant_compare import own_token_kl


@torch.no_grad()
def own_token_loss(model, demos: sft.Demonstrations, batch_size: int = 8) -> float:
    total, n = 0.0, 0
    for start in range(0, len(demos), batch_size):
        ids_BT, labels_BT = demos.batch(list(range(start, min(start + batch_size, len(demos)))), "cpu")
        own_BT = labels_BT != IGNORE_INDEX
        logits_NV = model(ids_BT).logits_BTV.float()[own_BT]
        total += float(torch.nn.functional.cross_entropy(logits_NV, labels_BT[own_BT], reduction="sum"))
        n += int(own_BT.sum())
    return total / max(n, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("heldout")
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    table = read_parquet(args.heldout)
    result = {"benchmark": "ptq_cost", **run_header(), "heldout": args.heldout, "rows": []}
    for ckpt in args.checkpoints:
        model = load_model(ckpt, qat=False)[0].eval()
        demos = sft.Demonstrations(table, model.cfg.vocab_size)
        row = {"checkpoint": ckpt, "fp32_loss": own_token_loss(model, demos)}
        for rounding in ("ceil", "floor"):
            quantized = convert_to_mx(copy.deepcopy(model), rounding).eval()
            row[f"ptq_{rounding}_loss"] = own_token_loss(quantized, demos)
            row[f"ptq_{rounding}_drop"] = row[f"ptq_{rounding}_loss"] - row["fp32_loss"]
            row[f"ptq_{rounding}_kl"] = own_token_kl(model, quantized, demos)
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
