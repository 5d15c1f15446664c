"""MXFP4-weight matmul (kernels.mx) against bf16 torch.matmul on one GPU, correctness first.

    PYTHONPATH=. python benchmarks/mx.py --out benchmarks/results/mx_h200.json [--commit SHA]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/mx.py --smoke --out /tmp/mx_smoke.json   (CPU dry run)

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
import datetime
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
import traceback

import torch

from kernels.mx import GEMM_MAX_M, GEMV_MAX_M, matmul_path, mx_linear, naive, quantize_mx
from kernels.mx.quant import fake_quant_torch
from kernels.mx.triton_matmul import (
    GemmConfig, GemvConfig, _split_plan, _splits_for, default_gemm_config, default_gemv_config, dequant_fp4_bf16,
    fake_quant_triton, mx_gemm, mx_gemv,
)

SHAPES = {"dense_7168": (7168, 7168), "expert_gate_up": (3584, 3072), "expert_down": (3072, 3584)}  # (K, N)
MS = (1, 8, 16, 4096)

# GemvConfig fields plus per_sm (programs per SM, 0 = no split) for M = 1: default_gemv_config's two
# tiles on every shape, a 32-row packed tile, and session 3's default (fp32 block sums), for
# comparison (docs/log/mx.md).
GEMV_SWEEP = [dict(block_n=64, groups=32, num_warps=8, per_sm=7, prefetch=True, accumulate="f16x2", loop="elementwise"),
              dict(block_n=16, groups=128, num_warps=4, per_sm=7, accumulate="f16x2", loop="elementwise"),
              dict(block_n=32, groups=32, num_warps=4, per_sm=7, accumulate="f16x2", loop="elementwise"),
              dict(block_n=32, groups=8, num_warps=4, per_sm=14, prefetch=True)]
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


def env_info(commit: str | None) -> dict:
    import triton

    if not torch.cuda.is_available():
        return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "commit": commit, "gpu": None, "torch": torch.__version__, "triton": triton.__version__}
    props = torch.cuda.get_device_properties(0)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,"
                              "power.limit,temperature.gpu", "--format=csv"], capture_output=True, text=True,
                             timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        smi = f"nvidia-smi failed: {exc!r}"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "gpu": props.name, "sms": props.multi_processor_count,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1), "l2_mib": getattr(props, "L2_cache_size", 0) / 2**20,
        "nvidia_smi": smi, "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "host": platform.node(),
    }


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


def _make_problem(m: int, k: int, n: int, dev, seed: int):
    g = torch.Generator(device=dev).manual_seed(seed)
    w = torch.randn(n, k, device=dev, generator=g) / k**0.5
    x = torch.randn(m, k, device=dev, generator=g, dtype=torch.float32).to(torch.bfloat16)
    wq = quantize_mx(w, "fp4_e2m1")
    return x, wq


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


def _copies(nbytes: int, l2_bytes: int) -> int:
    """Enough weight copies that a pass over all of them streams 2.5x the L2 (the weights come from HBM)."""
    return int(min(64, max(2, -(-int(2.5 * l2_bytes) // nbytes))))


def time_calls(fns, reps: int = 10) -> float:
    """Median milliseconds per call: the calls (typically one per weight copy) are captured once in
    a CUDA graph and replayed, so there are no launch gaps; with one call per weight copy and
    enough copies, every call reads its weights from HBM, as one layer after another does."""
    if not torch.cuda.is_available():  # --smoke: a host clock is enough to exercise the script
        t0 = time.perf_counter()
        for fn in fns:
            fn()
        return (time.perf_counter() - t0) * 1e3 / len(fns)
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(fns))
    del graph
    return sorted(times)[len(times) // 2]


def measure_ceilings(dev, smoke: bool) -> dict:
    """A device-to-device copy (bytes read + written) and a large bf16 GEMM, in this run."""
    a = torch.empty(2**29 if not smoke else 2**20, device=dev, dtype=torch.bfloat16).normal_()
    b = torch.empty_like(a)
    # Warm the clocks first: a 30 ms measurement straight after the host-side checks read
    # 2.77 TB/s on 2026-11-29 while bf16 cuBLAS then streamed 3.2 TB/s.
    for _ in range(3):
        time_calls([lambda: b.copy_(a)] * 20, reps=5)
    ms = time_calls([lambda: b.copy_(a)] * 8, reps=20)
    out = {"copy_GBps": round(2 * a.numel() * 2 / ms / 1e6, 1), "copy_bytes": 2 * a.numel() * 2}
    sz = 8192 if not smoke else 256
    p = torch.randn(sz, sz, device=dev, dtype=torch.bfloat16)
    q = torch.randn(sz, sz, device=dev, dtype=torch.bfloat16)
    ms = time_calls([lambda: torch.matmul(p, q)] * 4)
    out["bf16_matmul_TFLOPs"] = round(2 * sz**3 / ms / 1e9, 1)
    return out


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
        raise SystemExit("benchmarks/mx.py needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1)")
    else:
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(0)
        sms, l2 = props.multi_processor_count, getattr(props, "L2_cache_size", 60 << 20)
    torch.backends.cuda.matmul.allow_tf32 = False
    report = {"env": env_info(args.commit), "method": TIMING_NOTE, "checks": {}, "ceilings": {}, "rows": [],
              "status": "running"}

    def dump():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)

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
                _, wq0 = _make_problem(1, k, n, dev, seed=k + n)
                w_exact = naive.dequantize(wq0.element_codes(), wq0.scales, "fp4_e2m1", 32, k)
                if not torch.equal(dequant_fp4_bf16(wq0.codes, wq0.scales, k).double(), w_exact):
                    raise AssertionError(f"Triton dequant kernel != naive.dequantize for {name}")
                mx_bytes_w = n * k // 2 + n * k // 32
                mx_ws = [wq0] + [dataclasses.replace(wq0, codes=wq0.codes.clone(), scales=wq0.scales.clone())
                                 for _ in range(_copies(mx_bytes_w, l2) - 1)]
                w_bf16 = wq0.dequantize(torch.bfloat16)
                bf_ws = [w_bf16] + [w_bf16.clone() for _ in range(_copies(2 * n * k, l2) - 1)]
                report["checks"][f"dequant_kernel/{name}"] = "exact"

                for m in MS:
                    x, _ = _make_problem(m, k, 32, dev, seed=m + k + n)
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
            x, _ = _make_problem(1, *list(SHAPES.values())[0], dev, seed=1)
            wq = _make_problem(1, *list(SHAPES.values())[0], dev, seed=2)[1]
            report["repeat_first_shape_M1_hot_us"] = [round(time_calls([lambda: mx_linear(x, wq)] * 20) * 1e3, 2)
                                                      for _ in range(3)]
        error = None
    except Exception:
        error = traceback.format_exc()
    return close_report(report, t_start, dump, error)


def close_report(report: dict, t_start: float, dump, error: str | None) -> int:
    """Record how a benchmark run ended (status "ok", or "failed" with the traceback's tail) and its
    seconds since t_start, write the report (dump()), and return the process exit code."""
    report["status"] = "ok" if error is None else "failed"
    if error is not None:
        report["error"] = error[-3000:]
        print(report["error"], flush=True)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    dump()
    return 0 if error is None else 1


TIMING_NOTE = ("CUDA-graph replay, median of 10 replays, per call; one call per weight copy, with enough copies "
               "(weight_copies) that the weights stream from HBM rather than the 60 MB L2; hot_l2_* reuse one "
               "copy. Bytes: MXFP4 codes N*K/2 + scales N*K/32 (bf16: 2*N*K) + x + y. frac_copy_bw is over the "
               "device-to-device copy bandwidth measured in the same run.")


if __name__ == "__main__":
    sys.exit(main())
