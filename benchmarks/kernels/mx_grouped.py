"""One decode token through its routed k3 experts: the MXFP4 grouped GEMV against bf16, one GPU.

    PYTHONPATH=. python3 benchmarks/kernels/mx_grouped.py --out $OUT/mx_grouped_h200.json [--commit SHA]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/kernels/mx_grouped.py --smoke --out /tmp/mx_grouped.json  (CPU)

The k3 preset routes every token to top_k = 16 of its 896 experts (k3model.config), so at decode
(M = 1) an expert matmul never runs alone: each MoE projection is 16 GEMVs of the expert shape, one
per routed expert. kernels.mx.triton.gemv.mx_gemv_grouped runs them in one launch (the default
GEMV kernel, one weight of a stack per row of x). Per expert shape (gate/up 3584 -> 3072, whose 16
rows are the same token; down 3072 -> 3584, one row per expert), timed like benchmarks/kernels/mx.py
(time_calls: CUDA-graph replay, median of REPS; eight disjoint sets of 16 experts out of a stack of
128, so every call reads its 16 experts' weights from HBM):
- mx grouped: mx_gemv_grouped, the default config and a few tiles;
- mx per expert: 16 mx_gemv launches (one per expert, what a model without grouping runs);
- bf16 bmm: torch.bmm over the 16 experts' bf16 weights stored contiguously [16, N, K] (the
  strongest bf16 alternative: one batched cuBLAS call, no gather);
- bf16 per expert: 16 torch.matmul launches.
Checks first: every grouped output row within gemv_error_bound of the float64 reference of its
expert, for every config timed; bf16 bmm within 1e-2 relative.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback

import torch

from benchmarks.common import MX_SHAPES as SHAPES
from benchmarks.common import TIMING_NOTE, close_report, measure_ceilings, run_header, time_calls, write_json
from k3model.config import get_profile
from kernels.mx import naive, quantize_mx, unpack_fp4
from kernels.mx.triton.gemv import (
    GemvConfig, default_gemv_config, default_grouped_gemv_config, gemv_error_bound, mx_gemv, mx_gemv_grouped,
)

SETS = 8  # disjoint sets of top_k experts, used in turn: a call never finds its weights in L2
REPS = 30  # graph replays per timing (median)
# (block_n, groups, num_warps, prefetch) of the grouped sweep, one program per row tile (no split):
# the whole K in one step (groups 128: 3584 -> 112 of 128 lanes busy, 3072 -> 96), or steps of 16 / 32
# blocks, which divide both experts' K (112 = 7 x 16, 96 = 3 x 32), so every lane works.
TILES = [(16, 128, 4, False), (32, 128, 8, False), (128, 16, 4, False), (128, 16, 4, True), (64, 32, 4, False),
         (64, 32, 4, True), (64, 16, 4, False), (32, 32, 4, False), (128, 32, 8, False)]


def _stack(e: int, n: int, k: int, dev, seed: int):
    """e MXFP4 experts [n, k] (weights N(0, 1/k)) as stacked codes [e, n, k/2] and scales [e, n, k/32]."""
    g = torch.Generator(device=dev).manual_seed(seed)
    codes, scales = [], []
    for _ in range(e):  # one expert at a time: the fp32 weights of all 64 would take 2.8 GB
        wq = quantize_mx(torch.randn(n, k, device=dev, generator=g) / k**0.5, "fp4_e2m1")
        codes.append(wq.codes)
        scales.append(wq.scales)
    return torch.stack(codes), torch.stack(scales)


def _configs(n: int, k: int, rows: int, dev, smoke: bool) -> dict:
    """default_grouped_gemv_config's, default_gemv_config's (the one-expert default), and TILES."""
    default = default_grouped_gemv_config(n, k, rows, dev)
    configs = {"default": default, "single_default": default_gemv_config(n, k, dev)}
    for bn, groups, w, pf in TILES if not smoke else [(16, 2, 4, False), (32, 1, 4, True)]:
        cfg = GemvConfig(block_n=bn, groups=groups, split_k=1, num_warps=w, prefetch=pf)
        if cfg not in configs.values():
            configs[f"bn{bn}_g{groups}_w{w}" + ("_prefetch" if pf else "")] = cfg
    return configs


def run_shape(name: str, k: int, n: int, top_k: int, dev, smoke: bool, emit) -> None:
    e = SETS * top_k
    codes, scales = _stack(e, n, k, dev, seed=k + n)
    ids = torch.randperm(e, generator=torch.Generator().manual_seed(n)).to(torch.int32).view(SETS, top_k).to(dev)
    g = torch.Generator(device=dev).manual_seed(k)
    token = torch.randn(1, k, device=dev, generator=g).to(torch.bfloat16)
    # gate/up: the token itself goes to every expert; down: each expert its own hidden row.
    if name == "expert_gate_up":
        x = token.expand(top_k, k)
    else:
        x = torch.randn(top_k, k, device=dev, generator=g).to(torch.bfloat16)
    io_bytes = (k if x.stride(0) == 0 else top_k * k) * 2 + top_k * n * 2
    mx_bytes = top_k * (n * k // 2 + n * k // 32) + io_bytes
    bf_bytes = top_k * 2 * n * k + io_bytes
    base = {"shape": name, "K": k, "N": n, "top_k": top_k, "experts_in_stack": e}

    # The float64 reference of set 0, row by row, and the bound of the kernel's numerics.
    refs, bounds = [], []
    for j, ex in enumerate(ids[0].tolist()):
        w = _dequantize(codes[ex], scales[ex], k)
        xj = x[j:j + 1].contiguous()
        refs.append(xj.double() @ w.T)
        bounds.append(gemv_error_bound(xj, w, scales[ex], None, torch.bfloat16))
    ref, bound = torch.cat(refs), torch.cat(bounds)

    outs = [torch.empty(top_k, n, device=dev, dtype=torch.bfloat16) for _ in range(SETS)]
    t_cfg = {}
    for label, cfg in _configs(n, k, top_k, dev, smoke).items():
        out = torch.full((top_k, n), float("nan"), device=dev, dtype=torch.bfloat16)
        mx_gemv_grouped(x, codes, scales, ids[0], k, out, cfg)
        ratio = ((out.double() - ref).abs() / bound).max().item()
        if not ratio <= 1.0:
            raise AssertionError(f"{name} grouped {label} {cfg}: error / bound {ratio}")
        t = time_calls([lambda s=s: mx_gemv_grouped(x, codes, scales, ids[s], k, outs[s], cfg) for s in range(SETS)],
                       reps=REPS)
        t_cfg[label] = t
        emit({**base, "variant": f"mx_grouped_{label}", "config": dataclasses.asdict(cfg), "us": round(t * 1e3, 2),
              "bytes": mx_bytes, "max_err_over_bound": round(ratio, 4)})
    default = default_gemv_config(n, k, dev)  # what mx_linear runs for one expert
    ids_host = ids.tolist()
    singles = [torch.empty(1, n, device=dev, dtype=torch.bfloat16) for _ in range(top_k)]

    def per_expert(s):
        for j, ex in enumerate(ids_host[s]):
            mx_gemv(x[j:j + 1], codes[ex], scales[ex], k, None, singles[j], default)

    t_loop = time_calls([lambda s=s: per_expert(s) for s in range(SETS)], reps=REPS)
    emit({**base, "variant": "mx_per_expert_launches", "config": dataclasses.asdict(default),
          "us": round(t_loop * 1e3, 2), "bytes": mx_bytes})

    # bf16: the same experts, dequantized exactly, one contiguous [top_k, N, K] stack per set.
    wb = [torch.stack([_dequantize(codes[ex], scales[ex], k).to(torch.bfloat16) for ex in ids_host[s]])
          for s in range(SETS)]
    xb = x.unsqueeze(1)  # [top_k, 1, K]
    yb = torch.bmm(xb, wb[0].transpose(1, 2)).squeeze(1)
    rel = ((yb.double() - ref).norm() / ref.norm()).item()
    if not rel < 1e-2:
        raise AssertionError(f"{name} bf16 bmm relative error {rel}")
    t_bmm = time_calls([lambda s=s: torch.bmm(xb, wb[s].transpose(1, 2)) for s in range(SETS)], reps=REPS)
    emit({**base, "variant": "bf16_bmm", "us": round(t_bmm * 1e3, 2), "bytes": bf_bytes, "rel_err": rel})
    t_bf_loop = time_calls([lambda s=s: [torch.matmul(x[j:j + 1], wb[s][j].t()) for j in range(top_k)]
                            for s in range(SETS)], reps=REPS)
    emit({**base, "variant": "bf16_per_expert_launches", "us": round(t_bf_loop * 1e3, 2), "bytes": bf_bytes})
    best = min(t_cfg, key=t_cfg.get)
    emit({**base, "variant": "summary", "bf16_bmm_us": round(t_bmm * 1e3, 2),
          "mx_grouped_default_us": round(t_cfg["default"] * 1e3, 2),
          "speedup_default_vs_bf16_bmm": round(t_bmm / t_cfg["default"], 3),
          "best_config": best, "speedup_best_vs_bf16_bmm": round(t_bmm / t_cfg[best], 3),
          "speedup_default_vs_bf16_per_expert": round(t_bf_loop / t_cfg["default"], 3),
          "speedup_grouping_mx": round(t_loop / t_cfg["default"], 3)})


def _dequantize(codes: torch.Tensor, scales: torch.Tensor, k: int) -> torch.Tensor:
    """One expert's packed MXFP4 codes [N, Kp/2] and scales -> its exact weight [N, k] (float64)."""
    return naive.dequantize(unpack_fp4(codes), scales, "fp4_e2m1", 32, k)


def profile_launches(shapes: dict, top_k: int, dev) -> int:
    """One default grouped launch per shape (compiled first), bracketed for the profiler."""
    launches = []
    for name, (k, n) in shapes.items():
        codes, scales = _stack(top_k, n, k, dev, seed=k + n)
        ids = torch.arange(top_k, device=dev, dtype=torch.int32)
        x = torch.randn(top_k, k, device=dev).to(torch.bfloat16)
        out = torch.empty(top_k, n, device=dev, dtype=torch.bfloat16)
        launches.append(lambda x=x, c=codes, s=scales, i=ids, k=k, o=out: mx_gemv_grouped(x, c, s, i, k, o))
        launches[-1]()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("ncu launches done")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the JSON report (required unless --ncu)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    ap.add_argument("--ncu", action="store_true",
                    help="one grouped launch per expert shape (default config) between cudaProfilerStart/Stop, "
                         "for `ncu --profile-from-start off`; no timing")
    args = ap.parse_args(argv)
    top_k = get_profile("k3").model.top_k
    shapes = {name: SHAPES[name] for name in ("expert_gate_up", "expert_down")}
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--smoke runs the Triton kernels through the interpreter: set TRITON_INTERPRET=1")
        dev, top_k = torch.device("cpu"), 3
        shapes = {"expert_gate_up": (96, 40), "expert_down": (40, 96)}
    elif not torch.cuda.is_available():
        raise SystemExit("benchmarks/kernels/mx_grouped.py needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1)")
    else:
        dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.ncu:
        return profile_launches(shapes, top_k, dev)
    if not args.out:
        raise SystemExit("--out is required (unless --ncu)")
    report = {"env": run_header(args.commit), "method": TIMING_NOTE + " Here one call = one token through its "
              f"top_k experts; {SETS} disjoint expert sets in turn.", "top_k": top_k, "rows": [], "status": "running"}

    def dump():
        write_json(args.out, report)

    def emit(row):
        if "bytes" in row and copy_gbs:
            row["GBps"] = round(row["bytes"] / row["us"] / 1e3, 1)
            row["frac_copy_bw"] = round(row["GBps"] / copy_gbs, 3)
        report["rows"].append(row)
        print({key: v for key, v in row.items() if key != "config"}, flush=True)
        dump()

    t0 = time.perf_counter()
    copy_gbs = None
    try:
        with torch.no_grad():
            if not args.smoke:
                report["ceilings"] = measure_ceilings(dev, smoke=False)
                copy_gbs = report["ceilings"]["copy_GBps"]
            for name, (k, n) in shapes.items():
                run_shape(name, k, n, top_k, dev, args.smoke, emit)
        error = None
    except Exception:
        error = traceback.format_exc()
    return close_report(report, t0, dump, error)


if __name__ == "__main__":
    sys.exit(main())
