"""Errors of the KDA Triton kernels with bf16 operands in the pair-region products, on the CPU.

    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/kda_pair_precision.py --T 1000 --out /tmp/kda_pair_precision.json

Runs the default TileConfig, bwd_pair_dtype="bf16" and both prep_pair_dtype / bwd_pair_dtype = "bf16"
under the interpreter (which rounds bf16 operands as the GPU does and accumulates in fp32) on bf16
inputs (1, T, 2, 128) with an initial state, and reports each output's and gradient's relative error
against the fp32 recurrence (fla's metric; its tolerances: o, ht 5e-3; dq, dk, dv, dh0 8e-3; dg,
dbeta 2e-2). A check before GPU time, not a timing: docs/log/kda.md, docs/gpu_runbook.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "kernels",
                                "kda"))
import interp_cases as ic  # noqa: E402  (interpreter shims and the gradient harness of the CPU tests)

import kernels.kda.chunk_triton as ct  # noqa: E402
from kernels.kda import naive_recurrent_kda  # noqa: E402

CONFIGS = {
    "default": ct.TileConfig(),
    "bwd_pairs_bf16": ct.TileConfig(bwd_pair_dtype="bf16"),
    "pairs_bf16": ct.TileConfig(prep_pair_dtype="bf16", bwd_pair_dtype="bf16"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=1000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1 (the CPU interpreter)")
    inputs = ic.make_inputs(1, args.T, 2, 128, 128, seed=5, dtype=torch.bfloat16)
    o_r, s_r, g_r = ic.grads(naive_recurrent_kda, [x.float() for x in inputs], True)
    ref = {"o": o_r, "ht": s_r, **g_r}
    res = {"shape": [1, args.T, 2, 128], "dtype": "bfloat16", "errors": {}}
    for name, cfg in CONFIGS.items():
        t0 = time.time()
        old = ct.set_tile_config(cfg)
        try:
            o, s, g = ic.grads(ic.triton_kda, list(inputs), True)
        finally:
            ct.set_tile_config(old)
        out = {"o": o, "ht": s, **g}
        res["errors"][name] = {n: ic.rel(out[n], ref[n]) for n in out}
        print(name, f"{time.time() - t0:.0f} s", {n: f"{e:.1e}" for n, e in res["errors"][name].items()}, flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
