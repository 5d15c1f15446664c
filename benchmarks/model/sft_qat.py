"""What QAT from the first step costs an SFT step: one profile's model trained with and without
MXFP4-weight / MXFP8-activation fake quantization on its routed experts (`prepare_qat`), timed
alternately in one process so machine load hits both alike.

    OMP_NUM_THREADS=1 python benchmarks/model/sft_qat.py --profile tiny --batch 4 --seq-len 1024 \
        --out benchmarks/results/train/2026-12-01_sft_qat_tiny_cpu.json

Random tokens, labels on every position: this measures speed, not learning.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import run_header
from k3model.config import get_profile
from k3model.model import K3Model
from k3model.train.common import autocast_for, build_optimizer, optimizer_step
from k3model.train.qat import prepare_qat


def step_seconds(model: K3Model, ids_BT: torch.Tensor, device: str, reps: int) -> list[float]:
    opt = build_optimizer(model, 1e-4, 0.1)
    out = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast_for(device):
            loss = model.compute_loss(ids_BT)["loss/total"]
        optimizer_step(model, opt, loss, 1.0)
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=f"benchmarks/results/train/{datetime.date.today()}_sft_qat_tiny_cpu.json")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = replace(get_profile(args.profile).model, vision=None)
    gen = torch.Generator().manual_seed(0)
    ids_BT = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len), generator=gen).to(device)
    times: dict[str, list[float]] = {"plain": [], "qat": []}
    for _ in range(args.rounds):
        for mode in ("plain", "qat"):
            torch.manual_seed(0)
            model = K3Model(cfg).to(device)
            if mode == "qat":
                prepare_qat(model)
            step_seconds(model, ids_BT, device, 1)  # warm-up
            times[mode] += step_seconds(model, ids_BT, device, args.reps)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"benchmark": "sft_qat", "header": run_header(), "profile": args.profile, "device": device,
              "batch": args.batch, "seq_len": args.seq_len, "step_s": times,
              "median_step_s": med, "tokens_per_s": {k: args.batch * args.seq_len / v for k, v in med.items()},
              "qat_over_plain": med["qat"] / med["plain"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_step_s", "tokens_per_s", "qat_over_plain")}))


if __name__ == "__main__":
    main()
