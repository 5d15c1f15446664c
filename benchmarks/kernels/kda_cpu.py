"""KDA on the CPU: the chunked torch path vs the token-by-token recurrence, at tiny-profile shapes.

The tiny profile's KDA layers have H = 4 heads of width 32 and train at T = 512 … 8192
(k3model/config.py), so those are the shapes: forward, and forward+backward, fp32, batch 1.
Medians of wall-clock repeats after one warm-up; the outputs of both paths are compared too.
The recurrence's forward+backward grows faster than T through autograd (77 s per call at T = 2048
on the 2-core CI machine), so it is timed once, and only up to RECURRENT_BWD_MAX_T.

    PYTHONPATH=. python benchmarks/kernels/kda_cpu.py --out benchmarks/results/kda/2026-11-29_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import run_header

SHAPES = [(1, 512, 4, 32), (1, 2048, 4, 32), (1, 8192, 4, 32)]
RECURRENT_BWD_MAX_T = 2048


def make_inputs(B, T, H, D, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    v = torch.randn(B, T, H, D, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, D, generator=gen) + 2.0)
    beta = torch.rand(B, T, H, generator=gen)
    return [q, k, v, g, beta]


def wall_ms(fn, reps):
    if reps > 1:
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def time_path(fn, inputs, reps, bwd_reps):
    fwd = wall_ms(lambda: fn(*inputs), reps)
    if bwd_reps == 0:
        return fwd, None
    leaves = [x.clone().requires_grad_(True) for x in inputs]

    def fb():
        o, _ = fn(*leaves)
        o.sum().backward()

    return fwd, wall_ms(fb, bwd_reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="e.g. benchmarks/results/kda/<date>_cpu.json")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    from kernels.kda import chunk_kda_torch, naive_recurrent_kda

    res = {"header": run_header(), "machine": platform.machine(), "processor": platform.processor(),
           "torch_threads": torch.get_num_threads(), "dtype": "float32",
           "load_average_at_start": os.getloadavg(), "rows": []}
    for (B, T, H, D) in SHAPES:
        inputs = make_inputs(B, T, H, D)
        row = {"B": B, "T": T, "H": H, "D": D}
        row["chunked_fwd_ms"], row["chunked_fwdbwd_ms"] = time_path(chunk_kda_torch, inputs, args.reps, args.reps)
        row["recurrent_fwd_ms"], row["recurrent_fwdbwd_ms"] = time_path(
            naive_recurrent_kda, inputs, args.reps, 1 if T <= RECURRENT_BWD_MAX_T else 0)
        row["speedup_fwd"] = row["recurrent_fwd_ms"] / row["chunked_fwd_ms"]
        if row["recurrent_fwdbwd_ms"] is not None:
            row["speedup_fwdbwd"] = row["recurrent_fwdbwd_ms"] / row["chunked_fwdbwd_ms"]
        o_c, _ = chunk_kda_torch(*inputs)
        o_r, _ = naive_recurrent_kda(*inputs)
        row["rel_err_chunked_vs_recurrent"] = ((o_c - o_r).norm() / o_r.norm()).item()
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    # Other processes on a shared machine show up here; compare only timings taken at a low load.
    res["load_average_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
