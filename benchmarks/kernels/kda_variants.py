"""KDA Triton launch shapes (`TileConfig`, kernels/kda/triton/common.py) on one GPU: correctness, then
per-kernel time.

The variants are launch shapes of the default kernels (warps, key slices, value blocks); the kernel
variants that earlier sessions swept here (the fused prep with the doubling inverse, tf32x3, fused
backward, bf16 pair products) were removed from the library, their results are in
benchmarks/results/kda/ and docs/log/kda.md. Each variant runs in its own subprocess with a timeout,
so a miscompile that raises an illegal memory access (it kills the CUDA context) loses only that
variant. Per variant:
1. correctness at (B, T, H, D) = (1, 1000, 4, 128), bf16 inputs (fla's test distribution: q, k
   L2-normalised U(0, 1), g = logsigmoid(N(0, 1)), fp32 h0), against `chunk_kda_torch` in fp32:
   relative RMS error (fla's `assert_close`) of o, the final state and every gradient, within o/ht
   5e-3, dq/dk/dv/dh0 8e-3, dg/dbeta 2e-2. Also, for the record, the forward error against the
   fp32 recurrence with positive k and weak gates (logsigmoid(N(0, 1) + 3));
2. `triton.testing.do_bench` medians at (8, 4096, 16, 128) bf16 of each stage (prep, solve, forward
   state, backward state, backward) and of the whole forward and forward+backward through autograd.
The JSON is rewritten after every variant, so a timeout keeps what finished; each variant records
its `tile_config`, which `--tiles best:SWEEP.json` of benchmarks/kernels/kda.py reads (benchmarks/common.py).

Usage (H200; --jobs 8 checks and compiles the variants in parallel first, then times them one by one):
    PYTHONPATH=. python3 benchmarks/kernels/kda_variants.py --jobs 8 --out $OUT/kda_variants_h200.json
CPU smoke run of the same code path under Triton's interpreter, tiny shape: correctness, and every
timed stage run once without timing (it loads the interpreter shims from tests/kernels/kda/conftest.py):
    PYTHONPATH=. python3 benchmarks/kernels/kda_variants.py --quick --out /tmp/kda_variants_quick.json
Registers, spills and shared memory per kernel and variant, compiled for sm_90 on the CPU with
Triton's bundled ptxas (no GPU needed; uses Triton 3.6 internals to build the signatures):
    PYTHONPATH=. python3 benchmarks/kernels/kda_variants.py --resources --out /tmp/kda_variants_sm90.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from benchmarks.common import ROOT, run_header

# Overrides of TileConfig(), the default: launch shapes around it.
VARIANTS = {
    "default": {},
    "pairs_w8": {"prep_pairs_warps": 8},
    "solve_w8": {"prep_solve_warps": 8},
    "state_w4": {"state_warps": 4},
    "bwd_values_w8": {"bwd_values_warps": 8},
    "bwd_pairs_w4": {"bwd_pairs_warps": 4},
    "bwd_pairs_bks16": {"bwd_key_slice": 16},
}
CHECK_SHAPE = (1, 1000, 4, 128)
TIME_SHAPE = (8, 4096, 16, 128)
QUICK_SHAPE = (1, 100, 2, 32)
TOL = {"o": 5e-3, "ht": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dh0": 8e-3, "dg": 2e-2, "dbeta": 2e-2}


# --------------------------------------------------------------------------------------------
# Worker: one variant, in its own process
# --------------------------------------------------------------------------------------------


def _emit(result):
    """One line per finished phase; the parent keeps the last, so partial results survive."""
    print("RESULT " + json.dumps(result), flush=True)


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(B, T, H, D, device, seed, positive=True, gate_shift=0.0):
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device=device).manual_seed(seed)
    draw = (lambda *s: torch.rand(*s, device=device, generator=gen)) if positive else \
        (lambda *s: torch.randn(*s, device=device, generator=gen))
    q = F.normalize(draw(B, T, H, D), dim=-1).to(torch.bfloat16)
    k = F.normalize(draw(B, T, H, D), dim=-1).to(torch.bfloat16)
    v = torch.randn(B, T, H, D, device=device, generator=gen).to(torch.bfloat16)
    g = F.logsigmoid(torch.randn(B, T, H, D, device=device, generator=gen) + gate_shift)
    beta = torch.rand(B, T, H, device=device, generator=gen).sigmoid().to(torch.bfloat16)
    h0 = torch.randn(B, H, D, D, device=device, generator=gen)
    return [q, k, v, g, beta, h0]


def _fwd_bwd(fn, inputs, seed=1):
    import torch

    leaves = [x.clone().requires_grad_(True) for x in inputs]
    o, ht = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True)
    gen = torch.Generator(device=o.device).manual_seed(seed)
    do = torch.randn(o.shape, device=o.device, generator=gen)
    dht = torch.randn(ht.shape, device=o.device, generator=gen)
    ((o.float() * do).sum() + (ht * dht).sum()).backward()
    names = ["dq", "dk", "dv", "dg", "dbeta", "dh0"]
    return {"o": o.detach(), "ht": ht.detach(), **{n: x.grad for n, x in zip(names, leaves)}}


def check(shape, device, tiles):
    """Errors of o, final state and every gradient vs the fp32 torch chunked path (fla's metric)."""
    import functools

    from kernels.kda.chunk_torch import chunk_kda_torch
    from kernels.kda.chunk_triton import chunk_kda_triton

    inputs = _inputs(*shape, device, seed=0)
    ref = _fwd_bwd(chunk_kda_torch, [x.float() for x in inputs])
    out = _fwd_bwd(functools.partial(chunk_kda_triton, tiles=tiles), inputs)
    errors = {n: _rel(out[n], ref[n]) for n in ref}
    finite = all(bool(x.isfinite().all()) for x in out.values())
    return errors, finite and all(errors[n] <= TOL[n] for n in errors)


def check_weak_decay(shape, device, tiles):
    """Forward error vs the fp32 recurrence for positive k and weak gates (informational)."""
    from kernels.kda.chunk_triton import chunk_kda_triton
    from kernels.kda.naive import naive_recurrent_kda

    q, k, v, g, beta, h0 = _inputs(*shape, device, seed=2, gate_shift=3.0)
    o, ht = chunk_kda_triton(q, k, v, g, beta, initial_state=h0, output_final_state=True, tiles=tiles)
    o_r, ht_r = naive_recurrent_kda(q.float(), k.float(), v.float(), g, beta.float(), initial_state=h0,
                                    output_final_state=True)
    return {"o": _rel(o, o_r), "ht": _rel(ht, ht_r)}


def _stage_ms(q, k, v, g, beta, do, scale, cfg, bench):
    """bench(fn) of each stage (kernels/kda/triton/), with the launch shapes cfg."""
    from kernels.kda.triton import bwd, prep, solve, state

    ms = {"prep_pairs": bench(lambda: prep.kda_prepare_pairs(q, k, g, beta, scale, cfg))}
    Gs, Akk, Aqk, QG, KG, GAM = prep.kda_prepare_pairs(q, k, g, beta, scale, cfg)
    ms["prep_solve"] = bench(lambda: solve.kda_prepare_solve(k, v, beta, Gs, Akk, cfg))
    Ti, W, U = solve.kda_prepare_solve(k, v, beta, Gs, Akk, cfg)
    ms["prep"] = ms["prep_pairs"] + ms["prep_solve"]
    ms["state_fwd"] = bench(lambda: state.kda_state_forward(W, U, QG, KG, Aqk, GAM, None, False, True, cfg))
    _, _, hs, vnew = state.kda_state_forward(W, U, QG, KG, Aqk, GAM, None, False, True, cfg)
    ms["state_bwd"] = bench(lambda: state.kda_state_backward(W, QG, KG, Aqk, GAM, do, None, False, cfg))
    dhs, dvnew, _ = state.kda_state_backward(W, QG, KG, Aqk, GAM, do, None, False, cfg)
    ms["bwd_chunk"] = bench(lambda: bwd.kda_chunk_backward(q, k, v, g, Gs, beta, Ti, hs, dhs, vnew, dvnew, do,
                                                           scale, cfg))
    return ms


def _do_bench(fn, grad_to_none=None):
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median", grad_to_none=grad_to_none)


def _run_once(fn, grad_to_none=None):
    """--quick stands in for do_bench: run the stage once (plumbing only), no time."""
    fn()
    return float("nan")


def time_stages(shape, cfg, device="cuda", bench=_do_bench):
    """bench medians (ms) of each stage and of the whole forward and forward+backward."""
    import torch

    from kernels.kda.chunk_triton import chunk_kda_triton

    B, T, H, D = shape
    q, k, v, g, beta, _ = _inputs(B, T, H, D, device, seed=3)
    do = torch.randn_like(v)
    with torch.no_grad():
        ms = _stage_ms(q, k, v, g, beta, do, D ** -0.5, cfg, bench)
    if device == "cuda":
        torch.cuda.empty_cache()  # the stages' buffers died with _stage_ms
    xs = [x.requires_grad_(True) for x in (q, k, v, g, beta)]
    ms["fwd"] = bench(lambda: chunk_kda_triton(*xs, tiles=cfg))

    def fwd_bwd():
        o, _ = chunk_kda_triton(*xs, tiles=cfg)
        o.backward(do)

    ms["fwdbwd"] = bench(fwd_bwd, grad_to_none=xs)
    return ms


def worker(name, quick, phase="all"):
    if quick:
        # The interpreter needs the shims of tests/kernels/kda/conftest.py (bf16 dots, NumPy ≥ 2.4).
        sys.path.insert(0, os.path.join(ROOT, "tests", "kernels", "kda"))
        import conftest  # noqa: F401  (patches the interpreter on import)
    import torch

    from kernels.kda.triton.common import TileConfig

    cfg = TileConfig(**VARIANTS[name])
    device = "cpu" if quick else "cuda"
    result = {"tile_config": dataclasses.asdict(cfg)}
    t = time.time()
    result["errors"], result["correct"] = check(QUICK_SHAPE if quick else CHECK_SHAPE, device, cfg)
    result["check_s"] = round(time.time() - t, 1)
    _emit(result)
    if quick:
        result["stages_run_once"] = sorted(time_stages(QUICK_SHAPE, cfg, device, bench=_run_once))
        _emit(result)
        return
    result["errors_weak_decay_positive_k"] = check_weak_decay(CHECK_SHAPE, device, cfg)
    _emit(result)
    if phase == "check":
        # Compile every timed kernel at the timing shape (Triton's on-disk cache keeps them), untimed.
        t = time.time()
        time_stages(TIME_SHAPE, cfg, bench=_run_once)
        result["compile_s"] = round(time.time() - t, 1)
        _emit(result)
        return
    t = time.time()
    result["ms"] = time_stages(TIME_SHAPE, cfg)
    result["time_s"] = round(time.time() - t, 1)
    _emit(result)
    torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------
# Parent: one subprocess per variant, JSON after each
# --------------------------------------------------------------------------------------------


def _worker_cmd(name, quick, phase):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if quick:
        env["TRITON_INTERPRET"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--phase", phase]
    return cmd + (["--quick"] if quick else []), env


def _collect(out, err, status, t):
    lines = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
    result = json.loads(lines[-1]) if lines else {}
    result["status"] = status
    result["wall_s"] = round(time.time() - t, 1)
    if status != "ok":
        result["stderr_tail"] = err[-3000:]
    return result


def run_variant(name, quick, timeout, phase="all"):
    cmd, env = _worker_cmd(name, quick, phase)
    t = time.time()
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, err, status = proc.stdout, proc.stderr, "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired as exc:  # the captured output is bytes here, whatever text= says
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (exc.stdout, exc.stderr))
        status = f"timeout after {timeout:.0f} s"
    return _collect(out, err, status, t)


def check_in_parallel(names, jobs, timeout, quick=False):
    """Correctness of every variant and a compile of its timed kernels, `jobs` processes at a time.

    Triton compiles on the CPU; with the kernels in its on-disk cache the serial timing phase after
    this spends its time on the GPU. Not timed, so sharing the GPU does not matter here."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(jobs) as pool:
        return dict(zip(names, pool.map(lambda n: run_variant(n, quick, timeout, "check"), names)))


def summary(name, r):
    errs = r.get("errors", {})
    worst = max(errs, key=lambda n: errs[n] / TOL[n]) if errs else None
    ms = r.get("ms", {})
    parts = [f"{name:14s} {r['status']:10s}", f"correct={r.get('correct')}"]
    if worst:
        parts.append(f"worst {worst} {errs[worst]:.2e}/{TOL[worst]:.0e}")
    if ms:
        parts.append(" ".join(f"{k}={v:.2f}" for k, v in ms.items()) + " ms")
    parts.append(f"({r['wall_s']} s)")
    return "  ".join(parts)


def main_sweep(args):
    res = run_header()
    res.update({
        "mode": "quick (interpreter: correctness, stages run once, no timing)" if args.quick else "gpu",
        "check_shape": QUICK_SHAPE if args.quick else CHECK_SHAPE, "time_shape": None if args.quick else TIME_SHAPE,
        "tolerances": TOL, "reference": "chunk_kda_torch on fp32 copies of the bf16 inputs",
        "timing": "triton.testing.do_bench median, warmup 25 ms, rep 100 ms; stage timings include output allocation",
        "variants": {},
    })
    print(json.dumps({k: res[k] for k in ("gpus", "torch", "triton", "python")}), flush=True)
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    start = time.time()
    checked = {}
    if args.jobs > 1:
        checked = check_in_parallel(names, args.jobs, min(args.timeout * 2, args.budget / 2), args.quick)
        res["parallel_check_s"] = round(time.time() - start, 1)
        for name, r in checked.items():
            print("checked", summary(name, r), flush=True)
    for name in names:
        left = args.budget - (time.time() - start)
        if name in checked and checked[name].get("correct") is not True:
            res["variants"][name] = {**checked[name], "timed": "no: failed or did not finish its check"}
        elif left < 20:
            res["variants"][name] = {**checked.get(name, {}), "status": "skipped (time budget)", "wall_s": 0.0}
        else:
            res["variants"][name] = run_variant(name, args.quick, min(args.timeout, left))
            if name in checked:
                res["variants"][name]["check_phase"] = checked[name]
        print(summary(name, res["variants"][name]), flush=True)
        res["elapsed_s"] = round(time.time() - start, 1)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    bad = [n for n, r in res["variants"].items() if r.get("correct") is not True]
    print(f"wrote {args.out}; {len(names) - len(bad)}/{len(names)} variants correct" + (f", not: {bad}" if bad else ""))
    return 0


# --------------------------------------------------------------------------------------------
# Resources: compile for sm_90 on the CPU and read registers / spills from the cubin
# --------------------------------------------------------------------------------------------


def main_resources(args):
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise ValueError("--resources compiles real kernels: unset TRITON_INTERPRET")
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from kernels.kda import chunk_triton as ct
    from kernels.kda.triton import bwd, prep, solve, state
    from kernels.kda.triton.common import TileConfig

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    rows: list[dict] = []

    class Offline:
        """Stands in for a kernel: a launch compiles it for sm_90 and records its resources."""

        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            def launch(*a, **kw):
                binder = create_function_from_signature(self.fn.signature, self.fn.params, backend)
                bound, spec, opts = binder(*a, **kw)
                opts, sig, constexprs, attrs = self.fn._pack_args(backend, kw, bound, spec, opts)
                kernel = triton.compile(ASTSource(self.fn, sig, constexprs, attrs), target=target,
                                        options=opts.__dict__)
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(kernel.asm["cubin"])
                    f.flush()
                    usage = subprocess.run([os.path.join(bindir, "cuobjdump"), "--dump-resource-usage", f.name],
                                           capture_output=True, text=True, check=True).stdout
                m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", usage)
                regs, stack, shared = int(m[1]), int(m[2]), int(m[3]) + kernel.metadata.shared
                warps = opts.num_warps
                # Hopper: 64K registers per SM, allocated per warp in units of 256; 228 KB shared,
                # 1 KB of it reserved per CTA; at most 64 warps and 32 CTAs.
                by_regs = 65536 // (-(-regs * 32 // 256) * 256 * warps)
                by_smem = (228 * 1024) // (shared + 1024)
                rows.append({"kernel": self.fn.__name__, "warps": warps, "regs": regs, "spill_stack_B": stack,
                             "shared_B": shared, "ctas_per_sm": min(by_regs, by_smem, 64 // warps, 32)})
            return launch

    stages = (prep, solve, state, bwd)
    names = [(m, n) for m in stages for n in dir(m) if n.startswith("_") and n.endswith("_kernel")]
    saved = {(m, n): getattr(m, n) for m, n in names}
    res = run_header()
    res.update({"mode": "resources (sm_90, compiled on the CPU)", "shape": TIME_SHAPE, "dtype": args.dtype,
                "variants": {}})
    B, T, H, D = TIME_SHAPE
    meta = lambda *s, dt=getattr(torch, args.dtype): torch.empty(*s, device="meta", dtype=dt)  # noqa: E731
    names_v = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    for name in names_v:
        rows.clear()
        cfg = TileConfig(**VARIANTS[name])
        for m, n in names:
            setattr(m, n, Offline(saved[m, n]))
        try:
            q, k, v, do = (meta(B, T, H, D) for _ in range(4))
            g, beta, h0 = meta(B, T, H, D, dt=torch.float32), meta(B, T, H), meta(B, H, D, D, dt=torch.float32)
            scale = D ** -0.5
            Gs, Ti, Aqk, W, U, QG, KG, GAM = ct.kda_prepare(q, k, v, g, beta, scale, cfg)
            _, ht, hs, vnew = state.kda_state_forward(W, U, QG, KG, Aqk, GAM, h0, True, True, cfg)
            dhs, dvnew, _ = state.kda_state_backward(W, QG, KG, Aqk, GAM, do, ht, True, cfg)
            bwd.kda_chunk_backward(q, k, v, g, Gs, beta, Ti, hs, dhs, vnew, dvnew, do, scale, cfg)
        finally:
            for m, n in names:
                setattr(m, n, saved[m, n])
        res["variants"][name] = list(rows)
        print(name, "  ".join(f"{r['kernel']}: {r['warps']}w {r['regs']}r spill {r['spill_stack_B']} B "
                              f"→ {r['ctas_per_sm']} CTA/SM" for r in rows), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", args.out)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="e.g. benchmarks/results/kda/<date>_variants_h200.json (required but for --worker)")
    ap.add_argument("--quick", action="store_true",
                    help="CPU interpreter smoke run: tiny shape, correctness, each timed stage run once untimed")
    ap.add_argument("--resources", action="store_true", help="registers/spills per kernel, sm_90, on the CPU")
    ap.add_argument("--variants", default="all", help=f"'all' or a comma list of {list(VARIANTS)}")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per variant")
    ap.add_argument("--budget", type=float, default=510.0, help="seconds for the whole sweep")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                    help="with --resources: the inputs' dtype")
    ap.add_argument("--jobs", type=int, default=1,
                    help="check and compile the variants this many at a time first; then time them one by one")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--phase", choices=("all", "check"), default="all", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.quick, args.phase)
        return 0
    if not args.out:
        ap.error("--out is required")
    unknown = set(args.variants.split(",")) - set(VARIANTS) - {"all"}
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    return main_resources(args) if args.resources else main_sweep(args)


if __name__ == "__main__":
    sys.exit(main())
