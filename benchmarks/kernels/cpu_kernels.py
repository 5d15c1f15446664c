"""The CPU C kernels against their torch paths, forward + backward, at the tiny training step's shapes
(issue 17), timed in turns in one process (median of `--reps`).

    OMP_NUM_THREADS=1 python benchmarks/kernels/cpu_kernels.py --out benchmarks/results/train/2026-12-01_cpu_kernels_tiny.json

SiTU-GLU at [2048, 384] (the dense layer), [4096, 128] (a MoE layer's routed rows) and [2048, 128]
(its shared expert); ShortConv + SiLU at [32, 64, 128] and [4, 512, 128] (stages 1 and 2).
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.common import run_header, time_interleaved, write_json
from kernels.short_conv import cpu as short_conv_cpu
from kernels.short_conv import short_conv_silu_torch
from kernels.situ_glu import cpu as situ_cpu
from kernels.situ_glu import situ_glu_torch


def _fwd_bwd(fn, *leaves):
    def run():
        for t in leaves:
            t.grad = None
        out = fn(*leaves)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(torch.ones_like(out))
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if situ_cpu.load() is None or short_conv_cpu.load() is None:
        raise SystemExit(f"the C kernels could not be built: {situ_cpu.load_error() or short_conv_cpu.load_error()}")
    torch.manual_seed(0)
    rows = []
    cases = [("situ_glu", shape) for shape in ((2048, 384), (4096, 128), (2048, 128))]
    cases += [("short_conv_silu", shape) for shape in ((32, 64, 128), (4, 512, 128))]
    for kernel, shape in cases:
        if kernel == "situ_glu":
            g, v = torch.randn(shape).requires_grad_(), (torch.randn(shape) * 5).requires_grad_()
            fns = {"c": _fwd_bwd(lambda a, b: situ_cpu.situ_glu_cpu(a, b, 4.0, 25.0), g, v),
                   "torch": _fwd_bwd(lambda a, b: situ_glu_torch(a, b, 4.0, 25.0), g, v)}
        else:
            x, w = torch.randn(shape).requires_grad_(), (torch.randn(shape[-1], 1, 4) * 0.5).requires_grad_()
            fns = {"c": _fwd_bwd(lambda a, b: short_conv_cpu.short_conv_silu_cpu(a, b, None), x, w),
                   "torch": _fwd_bwd(lambda a, b: short_conv_silu_torch(a, b, None), x, w)}
        dts = time_interleaved(fns, warmup=3, reps=args.reps)
        row = {"kernel": kernel, "shape": list(shape), "c_ms": dts["c"] * 1e3, "torch_ms": dts["torch"] * 1e3,
               "speedup": dts["torch"] / dts["c"]}
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        rows.append(row)
    if args.out:
        write_json(args.out, {**run_header(), "threads": torch.get_num_threads(),
                              "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                              "timing": f"forward + backward, median of {args.reps} in turns (c, torch)",
                              "rows": rows})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
