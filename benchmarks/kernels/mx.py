"""MXFP4-weight matmul (kernels.mx) against bf16 torch.matmul on one GPU, correctness first.

    PYTHONPATH=. python benchmarks/kernels/mx.py --out benchmarks/results/mx/<date>_h200.json [--commit SHA]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/kernels/mx.py --smoke --out /tmp/mx_smoke.json   (CPU dry run)

1. Checks (any failure stops the run before timing; the JSON records it):
   quantize_mx on the GPU == naive.quantize (codes and scales) on blocks with NaN, Inf, zeros,
   subnormals, huge and tiny values; the Triton fake-quant kernel == the torch path, bit for bit;
   every matmul path and every swept config against a float64 reference, outputs poisoned with NaN.
2. Ceilings: device-to-device copy bandwidth (bytes read + written) and bf16 cuBLAS throughput.
3. Timing (see TIMING_NOTE): CUDA-graph replays over enough weight copies that every call reads its
   weights from HBM (do_bench's per-call L2 flush left the host launch cost inside the timed window:
   the 2026-11-29 first run, docs/log/mx.md). Shapes K x N = 7168 x 7168 and the k3 expert matmuls
   3584 -> 3072 (gate/up) and 3072 -> 3584 (down), at M = 1, 8, 16 (decode) and 4096 (prefill):
   bf16 torch.matmul, the dispatcher's default (mx_linear), mx_linear with MXFP8 activations, and a
   sweep of kernel configs.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import multiprocessing as mp
import os
import sys
import time
import traceback

import torch

from benchmarks.common import (
    MX_SHAPES, TIMING_NOTE, close_report, measure_ceilings, mx_problem, run_header, time_calls, weight_copies,
    write_json,
)
from kernels.mx import GEMM_MAX_M, GEMV_MAX_M, matmul_path, mx_linear, naive, quantize_mx
from kernels.mx.quant import fake_quant_torch
from kernels.mx.triton.common import _split_plan, _splits_for
from kernels.mx.triton.dequant import dequant_fp4_bf16
from kernels.mx.triton.fake_quant import fake_quant_triton
from kernels.mx.triton.gemm import GemmConfig, default_gemm_config, mx_gemm
from kernels.mx.triton.gemv import GemvConfig, default_gemv_config, mx_gemv

SHAPES = dict(MX_SHAPES)
MS = (1, 8, 16, 4096)

# GemvConfig fields plus per_sm (programs per SM, 0 = no split) for M = 1: default_gemv_config's two
# tiles on every shape and a 32-row tile (docs/log/mx.md).
GEMV_SWEEP = [dict(block_n=64, groups=32, num_warps=8, per_sm=7, prefetch=True),
              dict(block_n=16, groups=128, num_warps=4, per_sm=7),
              dict(block_n=32, groups=32, num_warps=4, per_sm=7)]
# (block_m, block_n, groups, num_warps, num_stages, programs per SM) for M = 8, 16.
GEMM_SMALL_SWEEP = [(16, 128, 2, 4, 3, 4), (16, 128, 4, 4, 3, 4), (16, 64, 4, 4, 3, 4)]
# The fused kernel at M = 4096, for comparison with the default (Triton dequant + cuBLAS).
GEMM_LARGE_SWEEP = [(128, 128, 2, 8, 3)]


def sweep_configs(m: int, k: int, n: int, sms: int, dev):
    if m == 1:
        for spec in GEMV_SWEEP:
            fields = {key: v for key, v in spec.items() if key != "per_sm"}
            split = _splits_for(-(-n // spec["block_n"]), k, spec["groups"], spec["per_sm"], sms) if spec["per_sm"] else 1
            yield "gemv", GemvConfig(split_k=split, **fields)
    elif m <= 16:
        for bm, bn, g, w, st, per_sm in GEMM_SMALL_SWEEP:
            yield "gemm", GemmConfig(bm, bn, g, _splits_for(-(-n // bn), k, g, per_sm, sms), w, st)
        yield "gemv", default_gemv_config(n, k, dev)
    else:
        for bm, bn, g, w, st in GEMM_LARGE_SWEEP:
            yield "gemm", GemmConfig(bm, bn, g, 1, w, st)


def _launch(kind, x, wq, out, cfg):
    fn = mx_gemv if kind == "gemv" else mx_gemm
    return fn(x, wq.codes, wq.scales, wq.shape[1], None, out, cfg)


def _compile_job(job):
    """Run one launch so that Triton compiles it into the shared on-disk cache (in a worker process)."""
    kind, m, k, n, cfg = job
    torch.manual_seed(0)
    if kind == "fake_quant":
        dtype, fmt, rnd = cfg
        fake_quant_triton(torch.randn(m, k, device="cuda").to(getattr(torch, dtype)), fmt, 32, rnd)
        torch.cuda.synchronize()
        return 0.0
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wq = quantize_mx(torch.randn(n, k, device="cuda"), "fp4_e2m1")
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    _launch(kind, x, wq, out, cfg)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def precompile(jobs, workers: int) -> dict:
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    failures = []
    try:
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            for job, fut in [(j, pool.submit(_compile_job, j)) for j in jobs]:
                try:
                    fut.result()
                except Exception as exc:  # a config that fails to compile is reported by the sweep
                    failures.append(f"{job[0]} {job[1:4]} {job[4]}: {exc!r}"[:300])
    except Exception as exc:
        print(f"precompile pool failed ({exc!r}); kernels compile on first use instead", flush=True)
    return {"jobs": len(jobs), "seconds": round(time.perf_counter() - t0, 1), "failures": failures}


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def _special_blocks(rows: int, k: int, dtype: torch.dtype, dev) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows + k)
    x = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-30, 30, (rows, 1), generator=g).float())
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    x[2, 7] = -float("inf")
    x[3, :32] = 0.0
    x[4, :32] = torch.finfo(dtype).tiny * torch.rand(32, generator=g)
    x[5, :32] = torch.finfo(dtype).max * (torch.rand(32, generator=g) * 2 - 1)
    x[6, :32] = torch.tensor([1e-30] * 31 + [1e30])
    x[7, :32] = -0.0
    return x.to(dtype).to(dev)


def check_quantize(dev, dtypes) -> dict:
    results = {}
    for dtype in dtypes:
        x = _special_blocks(64, 1000, dtype, dev)
        for fmt in ("fp4_e2m1", "fp8_e4m3"):
            for rnd in ("ceil", "floor"):
                t = quantize_mx(x, fmt, scale_rounding=rnd)
                codes, scales = naive.quantize(x.cpu(), fmt, scale_rounding=rnd)
                ok_q = torch.equal(t.element_codes().cpu(), codes) and torch.equal(t.scales.cpu(), scales)
                got = fake_quant_triton(x, fmt, 32, rnd)
                want = fake_quant_torch(x, fmt, 32, rnd)
                same = ((got == want) & (torch.signbit(got) == torch.signbit(want))) | (got.isnan() & want.isnan())
                key = f"{str(dtype).split('.')[-1]}/{fmt}/{rnd}"
                results[key] = {"quantize_equals_naive": ok_q, "triton_fake_quant_equals_torch": bool(same.all())}
                if not (ok_q and same.all()):
                    raise AssertionError(f"quantization check failed for {key}: {results[key]}")
    return results


def _reference(x: torch.Tensor, wq, rows: torch.Tensor | None, act_fmt=None) -> torch.Tensor:
    """float64 reference on the GPU (naive decode; optionally only some rows of x)."""
    xs = x if rows is None else x[rows]
    return naive.mx_linear(xs, wq.element_codes(), wq.scales, wq.shape[1], act_fmt=act_fmt)


def _check_rows(m: int, dev):
    if m <= 64:
        return None
    return torch.cat([torch.arange(0, 128), torch.arange(m - 128, m)]).to(dev)


def _check_output(out, ref, rows, tol: float, what: str) -> float:
    """Relative error of out (some rows of it) against the float64 reference; NaN anywhere fails."""
    if torch.isnan(out).any():
        raise AssertionError(f"{what}: NaN in the output (an element was not written)")
    err = _rel_err(out if rows is None else out[rows], ref)
    if err > tol:
        raise AssertionError(f"{what}: relative error {err:.2e} > {tol}")
    return err


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    args = ap.parse_args(argv)
    global SHAPES, MS
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--smoke runs the Triton kernels through the interpreter: set TRITON_INTERPRET=1")
        dev, sms, l2 = torch.device("cpu"), 8, 0  # two weight copies each: the interpreter is slow
        SHAPES, MS = {"small": (96, 40), "small_down": (64, 72)}, (1, 8, 20)
    elif not torch.cuda.is_available():
        raise SystemExit("benchmarks/kernels/mx.py needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1)")
    else:
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(0)
        sms, l2 = props.multi_processor_count, getattr(props, "L2_cache_size", 60 << 20)
    torch.backends.cuda.matmul.allow_tf32 = False
    report = {"env": run_header(args.commit), "method": TIMING_NOTE, "checks": {}, "ceilings": {}, "rows": [],
              "status": "running"}

    def dump():
        write_json(args.out, report)

    t_start = time.perf_counter()
    jobs = [("fake_quant", 64, 1000, 0, (dt, fmt, rnd)) for dt in ("float32", "bfloat16", "float16")
            for fmt in ("fp4_e2m1", "fp8_e4m3") for rnd in ("ceil", "floor")]
    for name, (k, n) in SHAPES.items():
        for m in MS:
            for kind, cfg in sweep_configs(m, k, n, sms, dev):
                jobs.append((kind, m, k, n, cfg))
            if m <= GEMV_MAX_M:
                jobs.append(("gemv", m, k, n, default_gemv_config(n, k, dev)))
            elif m <= GEMM_MAX_M:
                jobs.append(("gemm", m, k, n, default_gemm_config(m, n, k, dev)))
    jobs = list(dict.fromkeys(jobs))
    report["precompile"] = (precompile(jobs, min(args.workers, len(jobs))) if not args.smoke
                            else {"failures": [], "seconds": 0})
    print(f"precompiled {len(jobs)} kernels in {report['precompile']['seconds']} s "
          f"({len(report['precompile']['failures'])} failures)", flush=True)

    try:
        with torch.no_grad():
            dtypes = (torch.float32,) if args.smoke else (torch.float32, torch.bfloat16, torch.float16)
            report["checks"]["quantize"] = check_quantize(dev, dtypes)
            print("quantize / fake-quant checks passed", flush=True)

            report["ceilings"] = measure_ceilings(dev, args.smoke)
            copy_gbs = report["ceilings"]["copy_GBps"]
            print(f"ceilings: {report['ceilings']}", flush=True)

            for name, (k, n) in SHAPES.items():
                _, wq0 = mx_problem(1, k, n, dev, seed=k + n)
                w_exact = naive.dequantize(wq0.element_codes(), wq0.scales, "fp4_e2m1", 32, k)
                if not torch.equal(dequant_fp4_bf16(wq0.codes, wq0.scales, k).double(), w_exact):
                    raise AssertionError(f"Triton dequant kernel != naive.dequantize for {name}")
                mx_bytes_w = n * k // 2 + n * k // 32
                mx_ws = [wq0] + [dataclasses.replace(wq0, codes=wq0.codes.clone(), scales=wq0.scales.clone())
                                 for _ in range(weight_copies(mx_bytes_w, l2) - 1)]
                w_bf16 = wq0.dequantize(torch.bfloat16)
                bf_ws = [w_bf16] + [w_bf16.clone() for _ in range(weight_copies(2 * n * k, l2) - 1)]
                report["checks"][f"dequant_kernel/{name}"] = "exact"

                for m in MS:
                    x, _ = mx_problem(m, k, 32, dev, seed=m + k + n)
                    rows = _check_rows(m, dev)
                    ref = _reference(x, wq0, rows)
                    ref8 = _reference(x, wq0, rows, "fp8_e4m3")
                    io_bytes = m * k * 2 + m * n * 2
                    mx_bytes = mx_bytes_w + io_bytes
                    bf_bytes = 2 * n * k + io_bytes
                    flops = 2 * m * n * k
                    base = {"shape": name, "K": k, "N": n, "M": m}

                    def row(variant, ms_, nbytes, extra=None):
                        r = {**base, "variant": variant, "us": round(ms_ * 1e3, 2),
                             "GBps": round(nbytes / ms_ / 1e6, 1),
                             "frac_copy_bw": round(nbytes / ms_ / 1e6 / copy_gbs, 3),
                             "TFLOPs": round(flops / ms_ / 1e9, 2), **(extra or {})}
                        report["rows"].append(r)
                        return r

                    err = _check_output(torch.matmul(x, w_bf16.t()), ref, rows, 1e-2, "bf16 matmul")
                    t_bf = time_calls([lambda w=w: torch.matmul(x, w.t()) for w in bf_ws])
                    row("bf16_torch_matmul", t_bf, bf_bytes, {"rel_err": err, "weight_copies": len(bf_ws)})

                    path = matmul_path(x, wq0)
                    for variant, act, r_ in (("mx_linear_default", None, ref), ("mx_linear_act_fp8", "fp8_e4m3", ref8)):
                        err = _check_output(mx_linear(x, wq0, act_fmt=act), r_, rows, 1e-2, f"{variant} {name} M={m}")
                        t = time_calls([lambda w=w: mx_linear(x, w, act_fmt=act) for w in mx_ws])
                        extra = {"path": path, "rel_err": err, "speedup_vs_bf16": round(t_bf / t, 2),
                                 "weight_copies": len(mx_ws)}
                        if variant == "mx_linear_default" and m == 1:
                            # One weight copy, L2-resident: the kernel's own (ALU) limit.
                            g_bf = time_calls([lambda: torch.matmul(x, w_bf16.t())] * 20)
                            g_mx = time_calls([lambda: mx_linear(x, wq0)] * 20)
                            extra.update(hot_l2_us=round(g_mx * 1e3, 2), hot_l2_bf16_us=round(g_bf * 1e3, 2))
                        row(variant, t, mx_bytes, extra)

                    for kind, cfg in sweep_configs(m, k, n, sms, dev):
                        out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
                        desc = {"kernel": kind, "config": dataclasses.asdict(cfg),
                                "splits": _split_plan(k // 32, cfg.groups, cfg.split_k)[1]}
                        try:
                            _launch(kind, x, wq0, out, cfg)
                            err = _check_output(out, ref, rows, 1e-2, f"{kind} {cfg}")
                            outs = [torch.empty_like(out) for _ in mx_ws]
                            t = time_calls([lambda w=w, o=o: _launch(kind, x, w, o, cfg) for w, o in zip(mx_ws, outs)])
                        except Exception as exc:
                            report["rows"].append({**base, "variant": "sweep", **desc, "error": repr(exc)[:400]})
                            continue
                        row("sweep", t, mx_bytes, {**desc, "rel_err": err, "speedup_vs_bf16": round(t_bf / t, 2)})

                    mine = [r for r in report["rows"] if r["shape"] == name and r["M"] == m]
                    d = next(r for r in mine if r["variant"] == "mx_linear_default")
                    best = min((r for r in mine if r["variant"] == "sweep" and "us" in r), key=lambda r: r["us"],
                               default=None)
                    print(f"{name:15s} M={m:5d} bf16 {t_bf * 1e3:8.2f} us | mx default {d['us']:8.2f} us "
                          f"x{d['speedup_vs_bf16']:<5} {d['frac_copy_bw']:5.0%} bw ({d['path']}) | "
                          f"best sweep {best['us'] if best else float('nan'):8.2f} {best['config'] if best else ''}",
                          flush=True)
                    dump()
            x, _ = mx_problem(1, *list(SHAPES.values())[0], dev, seed=1)
            wq = mx_problem(1, *list(SHAPES.values())[0], dev, seed=2)[1]
            report["repeat_first_shape_M1_hot_us"] = [round(time_calls([lambda: mx_linear(x, wq)] * 20) * 1e3, 2)
                                                      for _ in range(3)]
        error = None
    except Exception:
        error = traceback.format_exc()
    return close_report(report, t_start, dump, error)


if __name__ == "__main__":
    sys.exit(main())
