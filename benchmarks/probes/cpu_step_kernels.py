"""How much do session 12's CPU kernels save at the tiny step's shapes? Each module's C path against its
torch path (`K3_CPU_KERNELS=torch`), forward + backward, timed in turns in one process (issue 17).

    OMP_NUM_THREADS=1 python benchmarks/probes/cpu_step_kernels.py --out benchmarks/results/train/2026-12-02_cpu_step_kernels_tiny.json

AttnRes's depth mix over 2 and 3 sources of [32, 64, 128] (the tiny step has eight mixers of 2–3
sources), RMSNorm at [2048, 128] and [2048, 64] (13 a step), KDA's q/k L2 norm at [32, 64, 4, 32]
(6 a step), SiTU-GLU at [4096, 128] (a MoE layer's routed rows), ShortConv + SiLU at [32, 64, 128] (9).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from benchmarks.common import run_header, write_json
from benchmarks.train_step import time_interleaved
from k3model.attn_res import AttnRes
from k3model.common import RMSNorm
from k3model.kda_layer import _l2_normalize
from kernels.kda.cpu import kda_l2_norm_cpu
from kernels.short_conv import short_conv_silu
from kernels.situ_glu import situ_glu


def _paths(fn, *leaves):
    """{"c": …, "torch": …}: one forward + backward of fn(*leaves) with the C kernels allowed or not."""
    def run(choice):
        def step():
            os.environ["K3_CPU_KERNELS"] = choice
            for t in leaves:
                t.grad = None
            out = fn(*leaves)
            out = out[0] if isinstance(out, tuple) else out
            out.backward(torch.ones_like(out))
        return step
    return {"c": run("auto"), "torch": run("torch")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    mix = AttnRes(128)
    with torch.no_grad():
        mix.query.normal_(0.0, 0.3)
    cases = {}
    for n in (2, 3):
        sources = [torch.randn(32, 64, 128).requires_grad_() for _ in range(n)]
        cases[f"attn_res N={n} [32, 64, 128]"] = _paths(lambda *s: mix(list(s)), *sources)
    for d in (128, 64):
        norm = RMSNorm(d)
        cases[f"rms_norm [2048, {d}]"] = _paths(lambda x, norm=norm: norm(x), torch.randn(2048, d).requires_grad_())
    x = torch.randn(32, 64, 4, 32).requires_grad_()
    cases["kda_l2_norm [32, 64, 4, 32]"] = {
        "c": _paths(lambda a: kda_l2_norm_cpu(a, 1e-6), x)["c"], "torch": _paths(lambda a: _l2_normalize(a, 1e-6), x)["c"]}
    g, v = torch.randn(4096, 128).requires_grad_(), (torch.randn(4096, 128) * 5).requires_grad_()
    cases["situ_glu [4096, 128]"] = _paths(lambda a, b: situ_glu(a, b, 4.0, 25.0), g, v)
    xc, w = torch.randn(32, 64, 128).requires_grad_(), (torch.randn(128, 1, 4) * 0.5).requires_grad_()
    cases["short_conv_silu [32, 64, 128]"] = _paths(lambda a, b: short_conv_silu(a, b), xc, w)
    rows = []
    try:
        for name, fns in cases.items():
            dts = time_interleaved(fns, warmup=3, reps=args.reps)
            row = {"case": name, "c_ms": dts["c"] * 1e3, "torch_ms": dts["torch"] * 1e3,
                   "speedup": dts["torch"] / dts["c"]}
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            rows.append(row)
    finally:
        os.environ.pop("K3_CPU_KERNELS", None)
    if args.out:
        write_json(args.out, {**run_header(), "threads": torch.get_num_threads(),
                              "timing": f"forward + backward, median of {args.reps} in turns (c, torch)", "rows": rows})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
