"""Launch shapes of the Triton glue kernels of the small profile's training step, on one GPU: which
module constants of `kernels/attn_res/triton.py`, `kernels/short_conv/triton.py` and
`kernels/moe_rows/triton.py` give the least device time for a forward + backward at the training
shapes of one micro-batch (32,768 rows; D = C = 1024; the MoE's 131,072 rows of L = 512, K = 4).
Each variant's forward and backward run ten times inside one CUDA graph, replayed (the device's time
alone: the eager calls are paced by the host, ~0.6–1.1 ms a forward + backward on the H200's host,
which hid the launch shapes in session 19's do_bench sweep). Per module the variants come in groups
(forward constants, backward constants); the fastest of each group are merged. The last line printed
is the result as `benchmarks/train_step.py --kernel-constants` takes it.

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
MOE_ROWS = "kernels.moe_rows.triton"
# Groups of variants per module; each group's fastest are merged into the module's result.
ATTN_RES_GROUPS = [[
    {"ROW_TILE": rt, "VALUES_PER_THREAD": vpt, "BWD_ROWS_PER_PROGRAM": rows, "BWD_STAGES": st}
    for rt, vpt in ((1024, 8), (2048, 8))
    for rows in sorted({rt // 1024, 4, 16}) for st in (1,)
]]
SHORT_CONV_GROUPS = [
    [{"BWD_ROWS": r, "BWD_WARPS": w} for r in (16, 32, 64, 128) for w in (4, 8)],
    [{"FWD_ROWS": r, "FWD_WARPS": w} for r in (32, 64, 128) for w in (4, 8)],
]
MOE_ROWS_GROUPS = [[{"ROW_TILE": rt, "NUM_WARPS": w} for rt in (2048, 4096, 8192) for w in (4, 8)]]


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
    """Device µs of each case (a function of device work) under each variant's constants."""
    from benchmarks.common import graph_us

    rows = []
    for constants in variants:
        before = set_constants(module_name, constants)
        row = {"constants": constants, "us": {}}
        try:
            for label, fn in cases.items():
                if quick:  # once each, untimed: the CPU smoke under TRITON_INTERPRET=1
                    fn()
                    row["us"][label] = 0.0
                else:
                    row["us"][label] = round(graph_us(fn), 1)
            row["total_us"] = round(sum(row["us"].values()), 1)
        except Exception as e:  # a launch shape that does not compile: record it, keep sweeping
            row["error"] = repr(e)[:300]
        set_constants(module_name, before)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def fastest(rows: list[dict]) -> dict:
    ok = [r for r in rows if "total_us" in r]
    return min(ok, key=lambda r: r["total_us"])["constants"] if ok else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None, choices=("attn_res", "short_conv", "moe_rows"),
                    help="sweep this module's kernels alone")
    ap.add_argument("--quick", action="store_true", help="CPU smoke under TRITON_INTERPRET=1: tiny shapes, untimed")
    args = ap.parse_args()
    if args.quick:
        import os

        from benchmarks.common import ROOT
        sys.path.insert(0, os.path.join(ROOT, "tests", "kernels", "kda"))
        import conftest  # noqa: F401  (the interpreter's shims)
    import kernels.attn_res.triton as ar
    import kernels.moe_rows.triton as mr
    import kernels.short_conv.triton as sc

    dev = "cpu" if args.quick else "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    M, D, B, T, HD, L, K = (64, 64, 2, 32, 32, 64, 4) if args.quick else (32768, 1024, 64, 512, 128, 512, 4)

    def attn_case(N):
        src = [torch.randn(M, D, device=dev, generator=gen).float()] + [  # the embedding source is fp32
            (torch.randn(M, D, device=dev, generator=gen) * 2).to(torch.bfloat16) for _ in range(N - 1)]
        wq = (0.5 * torch.randn(D, device=dev, generator=gen)) * (0.5 + torch.rand(D, device=dev, generator=gen))
        dh = torch.randn(M, D, device=dev, generator=gen)
        return lambda: (ar.attn_res_forward(src, wq, 1e-6), ar.attn_res_backward(dh, src, wq, 1e-6))

    def conv_case(head_dim):
        x = torch.randn(B, T, D, device=dev, generator=gen).to(torch.bfloat16)
        w = torch.randn(D, 1, 4, device=dev, generator=gen) * 0.5
        dy = torch.randn(B, T, D, device=dev, generator=gen).to(torch.bfloat16)
        return lambda: (sc._forward(x, w, head_dim, 1e-6), sc._backward(dy, x, w, head_dim, 1e-6))

    def rows_case():
        order = torch.randint(0, 32, (M * K,), device=dev, generator=gen).argsort(stable=True)
        inv = torch.empty_like(order).scatter_(0, order, torch.arange(M * K, device=dev)).view(M, K)
        y = torch.randn(M * K, L, device=dev, generator=gen).to(torch.bfloat16)
        p = torch.rand(M, K, device=dev, generator=gen)
        du = torch.randn(M, L, device=dev, generator=gen).to(torch.bfloat16)
        return lambda: (mr._gather_sum(y, inv, None, y.dtype), mr._gather_sum(y, inv, p, y.dtype),
                        mr.combine_backward(du, y, p, inv))

    report = {"env": run_header(), "shape": {"rows": M, "width": D, "moe_latent": L, "top_k": K},
              "timing": "device us of forward + backward, CUDA-graph replay"}
    if not args.quick:
        spin()
    best = {}
    for key, module_name, groups, cases in (
            ("attn_res", ATTN_RES, ATTN_RES_GROUPS, {"N2": attn_case(2), "N3": attn_case(3)}),
            ("short_conv", SHORT_CONV, SHORT_CONV_GROUPS, {"l2": conv_case(HD), "plain": conv_case(0)}),
            ("moe_rows", MOE_ROWS, MOE_ROWS_GROUPS, {"dispatch_bwd+combine": rows_case()})):
        if args.only not in (None, key):
            continue
        report[key] = []
        best[module_name] = {}
        for group in groups:
            rows = time_variants(module_name, group[:2] if args.quick else group, cases, args.quick)
            report[key] += rows
            best[module_name].update(fastest(rows))
        write_json(args.out, report)
    report["best"] = best
    write_json(args.out, report)
    print(";".join(f"{m}:" + ",".join(f"{k}={v}" for k, v in c.items()) for m, c in best.items() if c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
