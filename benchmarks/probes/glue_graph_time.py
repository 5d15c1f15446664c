"""Device time and host time of the two Triton glue ops (kernels/short_conv/triton.py,
kernels/attn_res/triton.py) at the small profile's training shapes, apart: `benchmarks/probes/
glue_sweep.py`'s do_bench medians did not change with the rows (32,768 or 65,536) nor much with the
launch shapes, as if the host set the pace. Here each host function (forward, backward) is captured
ten times in one CUDA graph and replayed (device time only), and the eager op through autograd is
timed on the host (perf_counter over 50 calls, one synchronize at the end).

    PYTHONPATH=. python3 benchmarks/probes/glue_graph_time.py --out $OUT/glue_graph_time.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from benchmarks.common import graph_us, run_header, write_json


def host_us(fn, calls: int = 50) -> float:
    """Wall µs per call of fn issued back to back (the host's pace if it is the slower side)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - t0) / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import kernels.attn_res.triton as ar
    import kernels.short_conv.triton as sc

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    report = {"env": run_header(), "rows": []}
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:  # clocks up from idle
        a @ a
    B, T, C = 64, 512, 1024
    x = torch.randn(B, T, C, device=dev, generator=gen).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(C, 1, 4, device=dev, generator=gen) * 0.5).requires_grad_()
    dy = torch.randn(B, T, C, device=dev, generator=gen).to(torch.bfloat16)
    # Session 19 also timed a one-kernel backward that shifted dp with tl.gather (539.5 µs, removed):
    # benchmarks/results/train/2026-12-03_glue_graph_time_h200.json.
    for constants in ({"BWD_ROWS": 32, "BWD_WARPS": 4}, {"BWD_ROWS": 64, "BWD_WARPS": 4}):
        for k, v in constants.items():
            setattr(sc, k, v)
        for head_dim in (128, 0):
            row = {"op": "short_conv", "constants": dict(constants), "head_dim": head_dim, "shape": [B, T, C]}
            try:
                row["graph_fwd_us"] = round(graph_us(lambda: sc._forward(x.detach(), w.detach(), head_dim, 1e-6)), 1)
                row["graph_bwd_us"] = round(graph_us(lambda: sc._backward(dy, x.detach(), w.detach(), head_dim, 1e-6)), 1)
                row["host_fwd_bwd_us"] = round(host_us(
                    lambda: torch.autograd.grad(sc.short_conv_silu_triton(x, w, head_dim), (x, w), dy)), 1)
            except Exception as e:
                row["error"] = repr(e)[:300]
            print(json.dumps(row), flush=True)
            report["rows"].append(row)
            write_json(args.out, report)
    M, D = 32768, 1024
    for N in (2, 3):
        src = [torch.randn(M, D, device=dev, generator=gen).float()] + \
              [(torch.randn(M, D, device=dev, generator=gen) * 2).to(torch.bfloat16) for _ in range(N - 1)]
        src = [s.requires_grad_() for s in src]
        q = (0.5 * torch.randn(D, device=dev, generator=gen)).requires_grad_()
        kw = (0.5 + torch.rand(D, device=dev, generator=gen)).requires_grad_()
        wq = (kw * q).detach()
        dh = torch.randn(M, D, device=dev, generator=gen)
        plain = [s.detach() for s in src]
        for constants in ({"ROW_TILE": 2048, "BWD_ROWS_PER_PROGRAM": 16}, {"ROW_TILE": 1024, "BWD_ROWS_PER_PROGRAM": 4},
                          {"ROW_TILE": 1024, "BWD_ROWS_PER_PROGRAM": 1}):
            for k, v in constants.items():
                setattr(ar, k, v)
            row = {"op": "attn_res", "constants": dict(constants), "N": N, "rows": M, "D": D}
            try:
                row["graph_fwd_us"] = round(graph_us(lambda: ar.attn_res_forward(plain, wq, 1e-6)), 1)
                row["graph_bwd_us"] = round(graph_us(lambda: ar.attn_res_backward(dh, plain, wq, 1e-6)), 1)
                row["host_fwd_bwd_us"] = round(host_us(
                    lambda: torch.autograd.grad(ar.attn_res_mix_triton(src, q, kw, 1e-6), src + [q, kw], dh)), 1)
            except Exception as e:
                row["error"] = repr(e)[:300]
            print(json.dumps(row), flush=True)
            report["rows"].append(row)
            write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
