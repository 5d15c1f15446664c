"""Launch shapes of the two Triton glue kernels of the KDA / AttnRes training step, on one GPU: which
module constants of `kernels/attn_res/triton.py` and `kernels/short_conv/triton.py` give the fastest
forward + backward at the small profile's training shapes (one micro-batch: 32,768 rows, D = C = 1024,
bf16). Triton alone (the Inductor peer is `benchmarks/attn_res.py` / `benchmarks/short_conv.py`).
The GPU is kept busy for a second first (an idle H200 sits at 345 MHz). The last line printed is the
fastest variants as `benchmarks/train_step.py --kernel-constants` takes them. Caution: these eager
calls are paced by the host (~0.6–1.1 ms a forward + backward on the H200's host, session 19), so the
medians hardly see the launch shapes; `glue_graph_time.py` times the device alone.

    PYTHONPATH=. python3 benchmarks/probes/glue_sweep.py --out $OUT/glue_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from benchmarks.common import run_header, write_json

ATTN_RES = "kernels.attn_res.triton"
SHORT_CONV = "kernels.short_conv.triton"
ATTN_RES_VARIANTS = [
    {"ROW_TILE": rt, "VALUES_PER_THREAD": vpt, "BWD_ROWS_PER_PROGRAM": rows, "BWD_STAGES": st}
    for rt, vpt in ((1024, 8), (2048, 8))
    for rows in sorted({rt // 1024, 4, 16}) for st in (1, 2)
]
SHORT_CONV_VARIANTS = [{"BWD_ROWS": r, "BWD_WARPS": w} for r in (16, 32, 64) for w in (4, 8)] + [
    {"FWD_ROWS": r, "FWD_WARPS": w} for r, w in ((16, 4), (32, 4), (32, 8), (64, 8))]


def set_constants(module_name: str, constants: dict) -> dict:
    module = sys.modules[module_name]
    before = {k: getattr(module, k) for k in constants}
    for k, v in constants.items():
        setattr(module, k, v)
    return before


def spin(seconds: float = 1.0) -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ a
    torch.cuda.synchronize()


def time_variants(module_name, variants, cases, quick=False) -> list[dict]:
    from triton.testing import do_bench

    if quick:  # once each, untimed: the CPU smoke under TRITON_INTERPRET=1
        do_bench = lambda fn, **kw: (fn(), 0.0)[1]  # noqa: E731
    rows = []
    for constants in variants:
        before = set_constants(module_name, constants)
        row = {"constants": constants, "us": {}}
        try:
            for label, make in cases.items():
                fn = make()
                fn()
                row["us"][label] = round(1e3 * do_bench(fn, warmup=25, rep=100, return_mode="median"), 1)
            row["total_us"] = round(sum(row["us"].values()), 1)
        except Exception as e:  # a launch shape that does not compile: record it, keep sweeping
            row["error"] = repr(e)[:300]
        set_constants(module_name, before)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="CPU smoke under TRITON_INTERPRET=1: tiny shapes, untimed")
    args = ap.parse_args()
    if args.quick:
        import os

        from benchmarks.common import ROOT
        sys.path.insert(0, os.path.join(ROOT, "tests", "kernels", "kda"))
        import conftest  # noqa: F401  (the interpreter's shims)
    from kernels.attn_res.triton import attn_res_mix_triton
    from kernels.short_conv.triton import short_conv_silu_triton

    dev = "cpu" if args.quick else "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    M, D, B, T, HD = (64, 64, 2, 32, 32) if args.quick else (32768, 1024, 64, 512, 128)

    def attn_case(N):
        def make():
            src = [(torch.randn(M, D, device=dev, generator=gen) * (1 + i)).to(torch.bfloat16).requires_grad_()
                   for i in range(N)]
            src[0] = src[0].detach().float().requires_grad_()  # the embedding source is fp32 in the model
            q = (0.5 * torch.randn(D, device=dev, generator=gen)).requires_grad_()
            kw = (0.5 + torch.rand(D, device=dev, generator=gen)).requires_grad_()
            dh = torch.randn(M, D, device=dev, generator=gen)
            return lambda: torch.autograd.grad(attn_res_mix_triton(src, q, kw, 1e-6), src + [q, kw], dh)
        return make

    def conv_case(head_dim):
        def make():
            x = torch.randn(B, T, D, device=dev, generator=gen).to(torch.bfloat16).requires_grad_()
            w = (torch.randn(D, 1, 4, device=dev, generator=gen) * 0.5).requires_grad_()
            dy = torch.randn(B, T, D, device=dev, generator=gen).to(torch.bfloat16)
            return lambda: torch.autograd.grad(short_conv_silu_triton(x, w, head_dim), (x, w), dy)
        return make

    report = {"env": run_header(), "shape": {"rows": M, "width": D}, "timing": "do_bench median, fwd+bwd, us"}
    if not args.quick:
        spin()
    attn_variants = ATTN_RES_VARIANTS[:2] if args.quick else ATTN_RES_VARIANTS
    report["attn_res"] = time_variants(ATTN_RES, attn_variants, {"N2": attn_case(2), "N3": attn_case(3)}, args.quick)
    write_json(args.out, report)
    report["short_conv"] = time_variants(SHORT_CONV, SHORT_CONV_VARIANTS, {"l2": conv_case(HD), "plain": conv_case(0)},
                                         args.quick)
    best = {}
    for key, module_name in (("attn_res", ATTN_RES), ("short_conv", SHORT_CONV)):
        ok = [r for r in report[key] if "total_us" in r]
        best[module_name] = min(ok, key=lambda r: r["total_us"])["constants"] if ok else {}
    report["best"] = best
    write_json(args.out, report)
    print(";".join(f"{m}:" + ",".join(f"{k}={v}" for k, v in c.items()) for m, c in best.items() if c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
