"""MXFP4 GEMV variants (kernels.mx GemvConfig: tiles, accumulate, split-K reduce) against bf16 torch.matmul, one GPU.

    PYTHONPATH=. python3 benchmarks/mx_variants.py --out $OUT/mx_variants_h200.json [--commit SHA]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/mx_variants.py --quick --out /tmp/mx_variants_quick.json

Each variant runs in its own subprocess with a timeout, so an inline-asm or miscompile error (or a
hung kernel) costs that variant only; the JSON is rewritten after every variant. In a variant's process:
1. Correctness first, against float64 (kernels.mx.naive) at M = 1 and 8 on the dense 7168 x 7168 and the
   gate/up expert (3584 -> 3072) weights: every output within kernels.mx.triton_matmul.gemv_error_bound
   (the bound derived in that module's docstring, incl. the bf16 output rounding), NaN exactly where the
   reference has NaN, outputs NaN-poisoned before the call. At M = 8 the x rows include 1e30-, 1e-30-
   and mixed-magnitude rows and a NaN. A reduce="in_kernel" variant must also give the bits of its
   config with reduce="separate" on each of INKERNEL_REPEATS further calls. A variant that fails is not timed.
2. Timing with benchmarks/mx.py's method (time_calls: CUDA-graph replay over enough weight copies that
   the weights stream from HBM), at M = 1, 8, 16 on dense 7168^2 and the k3 experts (gate/up
   3584 -> 3072, down 3072 -> 3584), beside bf16 torch.matmul timed in the same process.
The parent measures the device-to-device copy bandwidth (benchmarks/mx.py's measure_ceilings) before
and after the variants; frac_copy_bw is over the first.

--quick runs only step 1, under TRITON_INTERPRET=1 on the CPU at tiny shapes, through the same
subprocess machinery (a check that the script works end to end, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch

from benchmarks.mx import SHAPES, TIMING_NOTE, _copies, _make_problem, env_info, measure_ceilings, time_calls
from kernels.mx import naive
from kernels.mx.triton_matmul import (
    GemvConfig, _split_plan, _splits_for, default_gemv_config, gemv_error_bound, mx_gemv,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name -> GemvConfig fields, with split_k given or set from per_sm (about per_sm programs per SM,
# _splits_for); accumulate and loop default to "f16x2" and "elementwise". "default" is
# default_gemv_config (the dispatcher's GEMV). Variants timed earlier and slower than the default
# (f16x2 block sums, in-kernel split-K, the fp32 elementwise loop, one thread per weight word, a
# Triton-pipelined loop over the rows) are in docs/log/mx.md and
# benchmarks/results/mx_variants_*_h200.json.
VARIANTS = {
    "default": None,
    # accumulate="f16x2" with loop="elementwise" (_mx_gemv_elem_f16x2_kernel, 2026-11-29 session 4):
    # threads along GROUPS = 32 blocks, rows inside the threads, x' made once per thread per step for
    # all its rows; sm_90 SASS 3.4-4.1 instructions per weight value, no barrier (the default: 5.9).
    # "split_k" fixes the splits (1: the whole K in one program, one launch); "per_sm" sets them.
    "lx_bn64_w8_sm7_prefetch": dict(block_n=64, groups=32, num_warps=8, per_sm=7, prefetch=True),
    "lx_bn128_w8_sm7": dict(block_n=128, groups=32, num_warps=8, per_sm=7),
    "lx_bn128_w8_sm14": dict(block_n=128, groups=32, num_warps=8, per_sm=14),
    # Expert-sized weights: more, smaller programs over the whole K (one launch).
    "lx_bn8_g128_w4_s1": dict(block_n=8, groups=128, num_warps=4, split_k=1),
    "lx_bn8_g128_w8_s1": dict(block_n=8, groups=128, num_warps=8, split_k=1),
    "lx_bn4_g128_w4_s1": dict(block_n=4, groups=128, num_warps=4, split_k=1),
    "lx_bn16_g128_w8_s1": dict(block_n=16, groups=128, num_warps=8, split_k=1),
    "lx_bn8_g64_w4_s2": dict(block_n=8, groups=64, num_warps=4, split_k=2),
    # Session 5: the default with the one-launch reduction, and the grouped GEMV's 16-block steps
    # (16 / 8 rows per thread over 4 warps) on the dense weight.
    "lx_bn64_w8_sm7_prefetch_inkernel": dict(block_n=64, groups=32, num_warps=8, per_sm=7, prefetch=True,
                                             reduce="in_kernel"),
    "lx_bn128_g16_w4_sm4": dict(block_n=128, groups=16, num_warps=4, per_sm=4),
    "lx_bn64_g16_w4_sm7": dict(block_n=64, groups=16, num_warps=4, per_sm=7),
    # 16 rows per thread over 4 warps (sm_90: 2.89 instructions per value, the default's 3.23).
    "lx_bn64_g32_w4_sm7": dict(block_n=64, groups=32, num_warps=4, per_sm=7),
    "lx_bn64_g32_w4_sm14": dict(block_n=64, groups=32, num_warps=4, per_sm=14),
}
TIME_MS = (1, 8, 16)
CHECK_MS = (1, 8)
INKERNEL_REPEATS = 20  # reduce="in_kernel" calls compared bit for bit with reduce="separate" (GPU)
CHECK_SHAPES = ("dense_7168", "expert_gate_up")
# (K, N). K = 80 is padded to 96 in storage; K = 520 (17 blocks, padded to 544) is long enough to
# split at GROUPS = 8 (2 splits, the second ragged; 3 at GROUPS = 4), so --quick runs the split-K
# reductions.
QUICK_SHAPES = {"small_split": (520, 40), "small_down": (80, 72)}
CHILD_TIMEOUT_S = 120
TOTAL_BUDGET_S = 450  # the whole script stays under 8 minutes


def variant_config(name: str, k: int, n: int, dev: torch.device, sms: int) -> GemvConfig:
    spec = VARIANTS[name]
    if spec is None:
        return default_gemv_config(n, k, dev)
    fields = {key: v for key, v in spec.items() if key not in ("per_sm", "split_k")}
    fields.setdefault("accumulate", "f16x2")
    fields.setdefault("loop", "elementwise")
    if "split_k" in spec:
        split = spec["split_k"]
    else:
        split = _splits_for(-(-n // spec["block_n"]), k, spec["groups"], spec["per_sm"], sms)
    return GemvConfig(split_k=split, **fields)


def _check_x(m: int, k: int, dev, seed: int) -> torch.Tensor:
    """bf16 x [m, k]; for m >= 8: rows x 1e30, x 1e-30, alternating 1e30 / 1e-30 blocks, and a NaN."""
    x, _ = _make_problem(m, k, 32, dev, seed=seed)
    if m >= 8:
        xf = x.float()
        xf[1] *= 1e30
        xf[2] *= 1e-30
        blk = (torch.arange(k, device=dev) // 32) % 2 == 0
        xf[3] = torch.where(blk, xf[3] * 1e30, xf[3] * 1e-30)
        xf[4, k // 3] = float("nan")
        x = xf.to(torch.bfloat16)
    return x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def check_variant(name: str, shapes: dict, dev, sms: int, results: list) -> None:
    """Appends one record per (shape, M) to results; raises at the first failure (recorded first)."""
    # bf16 output as in use; the interpreter rounds fp32 -> bf16 by truncation (docs/log/mx.md), which
    # the bound (round to nearest) does not cover, so --quick writes fp32.
    out_dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    for shape in shapes:
        k, n = shapes[shape]
        _, wq = _make_problem(1, k, n, dev, seed=k + n)
        w = naive.dequantize(wq.element_codes(), wq.scales, "fp4_e2m1", 32, k)
        cfg = variant_config(name, k, n, dev, sms)
        for m in CHECK_MS:
            x = _check_x(m, k, dev, seed=m + k + n)
            ref = naive.mx_linear(x, wq.element_codes(), wq.scales, k)
            out = torch.full((m, n), float("nan"), device=dev, dtype=out_dtype)
            mx_gemv(x, wq.codes, wq.scales, k, None, out, cfg)
            bound = gemv_error_bound(x, w, wq.scales, cfg.accumulate, None, out.dtype, cfg.loop, cfg.groups)
            nan_ref = torch.isnan(ref)
            err = (out.double() - ref).abs()
            ok_nan = bool(torch.equal(torch.isnan(out), nan_ref))
            ratio = (err[~nan_ref] / bound[~nan_ref]).max().item()
            fin = ~nan_ref.any(dim=1)
            rel = ((out.double()[fin] - ref[fin]).norm() / ref[fin].norm()).item()
            r = {"shape": shape, "K": k, "N": n, "M": m, "config": dataclasses.asdict(cfg),
                 "max_err_over_bound": ratio, "rel_err_finite_rows": rel, "nan_pattern_matches": ok_nan,
                 "ok": ok_nan and ratio <= 1.0}
            if cfg.reduce == "in_kernel":
                # The same bits as the two-kernel reduction (same sum order) on every one of several
                # calls: a partial read before it was written (a memory-ordering bug) or a counter
                # not reset would show here, whichever program arrives last.
                sep = torch.full_like(out, float("nan"))
                mx_gemv(x, wq.codes, wq.scales, k, None, sep, dataclasses.replace(cfg, reduce="separate"))
                same = _same_bits(out, sep)
                # (The interpreter runs programs in one fixed order: repeating there adds nothing.)
                for _ in range(INKERNEL_REPEATS if dev.type == "cuda" else 0):
                    again = torch.full_like(out, float("nan"))
                    mx_gemv(x, wq.codes, wq.scales, k, None, again, cfg)
                    same = same and _same_bits(again, sep)
                r["same_bits_as_separate"] = same
                r["ok"] = r["ok"] and same
            results.append(r)
            if not r["ok"]:
                raise AssertionError(f"{name} {shape} M={m}: {r}")


def time_variant(name: str, dev, sms: int, l2: int, emit) -> None:
    for shape, (k, n) in SHAPES.items():
        _, wq0 = _make_problem(1, k, n, dev, seed=k + n)
        mx_bytes_w = n * k // 2 + n * k // 32
        # Copy i has every block scale times 2^(i % 4): the same work, but outputs that differ from
        # call to call, so a call that read another call's split-K partials would show (below).
        mx_ws = [wq0] + [dataclasses.replace(wq0, codes=wq0.codes.clone(), scales=wq0.scales + i % 4)
                         for i in range(1, _copies(mx_bytes_w, l2))]
        w_bf16 = wq0.dequantize(torch.bfloat16)
        bf_ws = [w_bf16] + [w_bf16.clone() for _ in range(_copies(2 * n * k, l2) - 1)]
        cfg = variant_config(name, k, n, dev, sms)
        plain = dataclasses.replace(cfg, reduce="separate")
        for m in TIME_MS:
            x, _ = _make_problem(m, k, 32, dev, seed=m + k + n)
            outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in mx_ws]
            t_bf = time_calls([lambda w=w: torch.matmul(x, w.t()) for w in bf_ws])
            t_mx = time_calls([lambda w=w, o=o: mx_gemv(x, w.codes, w.scales, k, None, o, cfg)
                               for w, o in zip(mx_ws, outs)])
            # Every output of the graph replays has the bits of an eager call with the two-kernel
            # reduction (each call's reduction read its own partials).
            replayed_ok = all(_same_bits(o, mx_gemv(x, w.codes, w.scales, k, None, torch.empty_like(o), plain))
                              for w, o in zip(mx_ws, outs))
            if not replayed_ok:
                raise AssertionError(f"{name} {shape} M={m}: graph-replayed outputs differ from eager calls")
            io = m * k * 2 + m * n * 2
            emit({"replayed_outputs_match_eager": replayed_ok, "shape": shape, "K": k, "N": n, "M": m, "config": dataclasses.asdict(cfg),
                  "splits": _split_plan(-(-k // 32), cfg.groups, cfg.split_k)[1],
                  "us": round(t_mx * 1e3, 2), "bf16_us": round(t_bf * 1e3, 2),
                  "speedup_vs_bf16": round(t_bf / t_mx, 3),
                  "bytes": mx_bytes_w + io, "bf16_bytes": 2 * n * k + io,
                  "weight_copies": len(mx_ws), "bf16_weight_copies": len(bf_ws)})


def run_child(name: str, out_path: str, quick: bool) -> int:
    """One variant, in its own process: checks, then (unless quick) timings; rewrites out_path as it goes."""
    res = {"variant": name, "status": "running", "checks": [], "rows": []}

    def dump():
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)

    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            if quick:
                dev, sms, l2, shapes = torch.device("cpu"), 8, 0, QUICK_SHAPES
            else:
                dev = torch.device("cuda")
                props = torch.cuda.get_device_properties(0)
                sms, l2 = props.multi_processor_count, getattr(props, "L2_cache_size", 60 << 20)
                shapes = {s: SHAPES[s] for s in CHECK_SHAPES}
            torch.backends.cuda.matmul.allow_tf32 = False
            check_variant(name, shapes, dev, sms, res["checks"])
            dump()
            if not quick:
                def emit(row):
                    res["rows"].append(row)
                    dump()
                time_variant(name, dev, sms, l2, emit)
        res["status"] = "ok"
    except Exception:
        res["status"] = "failed"
        res["error"] = traceback.format_exc()[-3000:]
    res["seconds"] = round(time.perf_counter() - t0, 1)
    dump()
    return 0 if res["status"] == "ok" else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--quick", action="store_true", help="correctness only, TRITON_INTERPRET=1 on the CPU, tiny shapes")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names from VARIANTS")
    ap.add_argument("--budget", type=float, default=TOTAL_BUDGET_S, help="seconds for the whole sweep")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--quick runs the Triton kernels through the interpreter: set TRITON_INTERPRET=1")
    if not args.quick and not torch.cuda.is_available():
        raise SystemExit("benchmarks/mx_variants.py needs a CUDA GPU (or --quick with TRITON_INTERPRET=1)")
    if args.child:
        return run_child(args.child, args.child_out, args.quick)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}: use names from {list(VARIANTS)}")

    t_start = time.perf_counter()
    report = {"env": env_info(args.commit), "method": TIMING_NOTE + " Each variant in its own process; bf16 "
              "torch.matmul timed in that process. frac_copy_bw over ceilings_before.copy_GBps.",
              "quick": args.quick, "variant_specs": {k: v for k, v in VARIANTS.items() if k in names},
              "ceilings_before": {}, "variants": {}, "rows": [], "status": "running"}
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)

    def dump():
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)

    if not args.quick:
        report["ceilings_before"] = measure_ceilings(torch.device("cuda"), smoke=False)
        print(f"ceilings: {report['ceilings_before']}", flush=True)
    copy_gbs = report["ceilings_before"].get("copy_GBps")
    dump()

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    for name in names:
        left = args.budget - (time.perf_counter() - t_start)
        if left < 30:
            report["variants"][name] = {"status": "skipped", "reason": f"time budget ({args.budget:.0f} s) spent"}
            dump()
            continue
        # beside, not under, $OUT: the device tool returns 8 files at most
        child_out = os.path.join(tempfile.gettempdir(), f"mx_variants_{os.getpid()}_{name}.json")
        if os.path.exists(child_out):
            os.remove(child_out)
        cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--child", name, "--child-out", child_out]
        if args.quick:
            cmd.append("--quick")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=min(CHILD_TIMEOUT_S, left))
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired as exc:
            rc = "timeout"
            tail = ((exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace"))[-2000:]
        res = {"status": "no output"}
        if os.path.exists(child_out):
            with open(child_out) as f:
                res = json.load(f)
            os.remove(child_out)
        if rc == "timeout":
            res["status"] = "timeout"
        res.update(returncode=rc, wall_s=round(time.perf_counter() - t0, 1))
        if rc != 0:
            res["output_tail"] = tail
        for row in res.get("rows", []):
            if copy_gbs:
                row["GBps"] = round(row["bytes"] / row["us"] / 1e3, 1)
                row["frac_copy_bw"] = round(row["GBps"] / copy_gbs, 3)
                row["bf16_frac_copy_bw"] = round(row["bf16_bytes"] / row["bf16_us"] / 1e3 / copy_gbs, 3)
            report["rows"].append({"variant": name, **row})
        report["variants"][name] = {k: v for k, v in res.items() if k != "rows"}
        worst = max((c["max_err_over_bound"] for c in res.get("checks", [])), default=float("nan"))
        m1 = [f"{r['shape']} {r['us']}us x{r['speedup_vs_bf16']}" for r in res.get("rows", []) if r["M"] == 1]
        print(f"{name:30s} {res['status']:8s} {res['wall_s']:6.1f} s  checks {len(res.get('checks', []))} "
              f"(max err/bound {worst:.3f})  M=1: {'; '.join(m1)}", flush=True)
        dump()

    if not args.quick:
        report["ceilings_after"] = measure_ceilings(torch.device("cuda"), smoke=False)
    all_ok = all(v.get("status") == "ok" for v in report["variants"].values())
    report["status"] = "ok" if all_ok else "some variants failed"
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    dump()
    print(f"{report['status']} in {report['seconds']} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
