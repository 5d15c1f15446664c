"""What the gated MLA layer's attention would cost on the CPU if its SDPA call could take the fused
(flash) kernel: a forecast for the clue evaluation and the long stages, not a change to the model.

    OMP_NUM_THREADS=1 python benchmarks/probes/mla_flash_forecast.py --checkpoint D/stage4/final \\
        --out benchmarks/results/train/<date>_mla_flash_forecast_tiny_cpu.json

k3model/mla.py calls `F.scaled_dot_product_attention(q, k, v, is_causal=True)` with q, k of head dim
nope + rope (48 on tiny) and v of head dim 32. PyTorch's CPU flash kernel needs one head dim for all
three, so the call falls back to the math path, which materializes B × H × T² scores (at T = 8192:
1 GiB per row, and ~75 % of an 8192-token forward). Zero-padding v to the q/k head dim and dropping
the padded output columns is the same attention (the extra value columns are 0, so are their
outputs) and takes the flash kernel. This probe times the model's forward (no grad, the clue
evaluation's case) and forward + backward (a training step's attention) both ways, in alternating
turns on one thread, and reports the largest logit difference.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import k3model.mla as mla
from benchmarks.common import run_header
from k3model.pretrain import load_pretrained

_SDPA = F.scaled_dot_product_attention


def _padded_sdpa(q, k, v, is_causal=False):
    dv = v.shape[-1]
    if q.shape[-1] == dv:
        return _SDPA(q, k, v, is_causal=is_causal)
    return _SDPA(q, k, F.pad(v, (0, q.shape[-1] - dv)), is_causal=is_causal)[..., :dv]


class _PaddedF:
    """Stands in for torch.nn.functional inside k3model.mla for the 'flash' turns only."""
    scaled_dot_product_attention = staticmethod(_padded_sdpa)

    def __getattr__(self, name):
        return getattr(F, name)


def _run(model, ids, backward: bool) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    if backward:
        model.zero_grad(set_to_none=True)
        out = model(ids).logits_BTV
        out.float().logsumexp(-1).mean().backward()
    else:
        with torch.no_grad():
            out = model(ids).logits_BTV
    return time.perf_counter() - t0, out.detach()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--lengths", default="512,2048,8192")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    model, _ = load_pretrained(args.checkpoint)
    model.eval()
    result = {**run_header(), "checkpoint": args.checkpoint, "threads": torch.get_num_threads(),
              "load_avg_1min_start": os.getloadavg()[0], "lengths": {}}
    for length in (int(x) for x in args.lengths.split(",")):
        ids = torch.randint(0, model.cfg.vocab_size, (1, length), generator=torch.Generator().manual_seed(length))
        row = {}
        for backward in (False, True):
            times = {"math": [], "flash": []}
            outs = {}
            for r in range(args.repeats):
                for name in (("math", "flash") if r % 2 == 0 else ("flash", "math")):
                    mla.F = _PaddedF() if name == "flash" else F
                    seconds, outs[name] = _run(model, ids, backward)
                    times[name].append(seconds)
            mla.F = F
            kind = "forward_backward" if backward else "forward"
            row[kind] = {"s_min": {k: min(v) for k, v in times.items()}, "s_all": times,
                         "speedup": min(times["math"]) / min(times["flash"]),
                         "max_abs_logit_diff": float((outs["math"] - outs["flash"]).abs().max())}
            print(length, kind, json.dumps({k: round(v, 3) for k, v in row[kind]["s_min"].items()}),
                  f"x{row[kind]['speedup']:.2f}", f"max|Δlogit| {row[kind]['max_abs_logit_diff']:.1e}", flush=True)
        result["lengths"][str(length)] = row
    result["load_avg_1min_end"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
