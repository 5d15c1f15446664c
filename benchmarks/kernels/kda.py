"""KDA on the GPU, one process: our Triton kernels vs fla-core 0.6.0 `chunk_kda` vs torch SDPA (causal).

Forward and forward+backward at (B, T, H, D) = (8, 4096, 16, 128), (1, 16384, 16, 128),
(1, 65536, 16, 128), (2, 32768, 32, 128), bf16 inputs as in shared/anchors/kda_bench_fla.py; plus
the one-token decode step at B = 64, H = 16. Ceilings (bf16 8192³ matmul, device copy) are measured
in the same run. Medians of `triton.testing.do_bench`.

Counting conventions (written into the JSON):
- KDA model FLOPs per token and head, chunk C = 64, d = K = V: forward 2·(5·C·d + 3·d²) — the
  A_qk/A_kk products, W and U, and the four state products W·S, QG·S, A_qk·V_new, KGᵀ·V_new —
  and forward+backward three times that.
- Minimal bytes per token and head: forward reads q, k, v, beta (bf16) and g (fp32) and writes o;
  forward+backward adds reading them and dO again and writing dq, dk, dv, dbeta (bf16), dg (fp32).
  Achieved GB/s is minimal bytes over time: a lower bound on the traffic the kernels really move.

Before timing: the gate gradient under strong decay (--strong-decay, issue 22 item 2): g = 2·logsigmoid(x − 2),
x ~ N(0, 1), T = 777, D = 128, bf16 q/k/v/beta with an fp32 initial state; ours and fla's o, final state and
every gradient against a float64 recurrence, over three seeds.

Usage (device machine): PYTHONPATH=.:/tmp/site python benchmarks/kernels/kda.py --out $OUT/kda_h200.json
fla is optional: without it the fla columns are null and the JSON says why.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys

import torch
import torch.nn.functional as F

from benchmarks.common import run_header, tile_config_from_arg, write_json

SHAPES = [(8, 4096, 16, 128), (1, 16384, 16, 128), (1, 65536, 16, 128), (2, 32768, 32, 128)]
CHUNK = 64


def kda_flops_fwd(B, T, H, D):
    return 2 * (5 * CHUNK * D + 3 * D * D) * B * T * H


def kda_bytes(B, T, H, D, backward):
    fwd = B * T * H * (2 * 3 * D + 4 * D + 2 + 2 * D)
    if not backward:
        return fwd
    return fwd + B * T * H * (2 * 3 * D + 4 * D + 2 + 2 * D) + B * T * H * (2 * 3 * D + 4 * D + 2)


def make_inputs(B, T, H, D, requires_grad):
    q = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    k = F.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).to(torch.bfloat16)
    v = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(B, T, H, D, device="cuda") + 3.0)
    beta = torch.sigmoid(torch.randn(B, T, H, device="cuda")).to(torch.bfloat16)
    xs = [q, k, v, g, beta]
    for x in xs:
        x.requires_grad_(requires_grad)
    return xs


def bench(fn, warmup=30, rep=200, grad_to_none=None):
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median", grad_to_none=grad_to_none)


def time_kda(fn, B, T, H, D):
    """(fwd ms with grad-requiring inputs, fwd+bwd ms, inference fwd ms)."""
    xs = make_inputs(B, T, H, D, requires_grad=True)
    fwd = bench(lambda: fn(*xs), warmup=20, rep=100)
    o, _ = fn(*xs)
    do = torch.randn_like(o)
    del o

    def fb():
        o, _ = fn(*xs)
        o.backward(do)

    fwdbwd = bench(fb, warmup=20, rep=100, grad_to_none=xs)
    with torch.no_grad():
        infer = bench(lambda: fn(*xs), warmup=20, rep=100)
    del xs, do
    torch.cuda.empty_cache()
    return fwd, fwdbwd, infer


def time_sdpa(B, T, H, D):
    qa = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ka = torch.randn_like(qa, requires_grad=True)
    va = torch.randn_like(qa, requires_grad=True)
    fwd = bench(lambda: F.scaled_dot_product_attention(qa, ka, va, is_causal=True), warmup=20, rep=100)
    oa = F.scaled_dot_product_attention(qa, ka, va, is_causal=True)
    doa = torch.randn_like(oa)
    del oa

    def fb():
        F.scaled_dot_product_attention(qa, ka, va, is_causal=True).backward(doa)

    fwdbwd = bench(fb, warmup=10, rep=60, grad_to_none=[qa, ka, va])
    del qa, ka, va, doa
    torch.cuda.empty_cache()
    return fwd, fwdbwd


def ceilings():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    ms = bench(lambda: a @ b, warmup=100, rep=500)
    tflops = 2 * 8192 ** 3 / ms / 1e9
    x = torch.randn(2 ** 29, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), warmup=50, rep=300)
    tbps = 2 * x.numel() * 2 / ms / 1e9
    del a, b, x, y
    torch.cuda.empty_cache()
    return tflops, tbps


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _write(res: dict, out: str) -> None:
    write_json(out, res)


def strong_decay_errors(fns: dict, seeds=(17, 18, 19), B=1, T=777, H=4, D=128) -> dict:
    """Relative errors (fla's metric) of o, final state and every gradient against the float64
    recurrence under strong decay, g = 2·logsigmoid(x − 2), per function and seed."""
    from kernels.kda import naive_recurrent_kda

    def run(fn, inputs):
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        o, ht = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True)
        gen = torch.Generator(device="cuda").manual_seed(1)
        do = torch.randn(o.shape, device="cuda", generator=gen, dtype=torch.float64)
        dht = torch.randn(ht.shape, device="cuda", generator=gen, dtype=torch.float64)
        ((o.double() * do).sum() + (ht.double() * dht).sum()).backward()
        names = ["dq", "dk", "dv", "dg", "dbeta", "dh0"]
        return {"o": o.detach(), "ht": ht.detach(), **{n: x.grad for n, x in zip(names, leaves)}}

    out = {name: {} for name in fns}
    for seed in seeds:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        q = F.normalize(torch.rand(B, T, H, D, device="cuda", generator=gen), dim=-1).to(torch.bfloat16)
        k = F.normalize(torch.rand(B, T, H, D, device="cuda", generator=gen), dim=-1).to(torch.bfloat16)
        v = torch.randn(B, T, H, D, device="cuda", generator=gen).to(torch.bfloat16)
        g = 2 * F.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=gen) - 2)
        beta = torch.rand(B, T, H, device="cuda", generator=gen).sigmoid().to(torch.bfloat16)
        h0 = torch.randn(B, H, D, D, device="cuda", generator=gen)
        inputs = [q, k, v, g, beta, h0]
        ref = run(naive_recurrent_kda, [x.double() for x in inputs])
        for name, fn in fns.items():
            got = run(fn, inputs)
            out[name][seed] = {n: rel(got[n].double(), ref[n]) for n in ref}
    return out


def _time_decode(res: dict, kda_decode_step_, fla_dec) -> None:
    """The one-token decode step, ours and fla's: B = 64 sequences, H = 16, a 128×128 fp32 state per head."""
    B, H, D = 64, 16, 128
    q, k, v, g, beta = (x[:, 0] for x in make_inputs(B, 1, H, D, requires_grad=False))
    S = torch.randn(B, H, D, D, device="cuda")
    res["decode_ours_ms"] = bench(lambda: kda_decode_step_(q, k, v, g, beta, S), warmup=50, rep=300)
    state_bytes = 2 * S.numel() * 4
    res["decode_ours_GBps"] = state_bytes / res["decode_ours_ms"] / 1e6
    if fla_dec is not None:
        S2 = torch.randn(B, H, D, D, device="cuda")
        args5 = [x[:, None] for x in (q, k, v, g, beta)]
        res["decode_fla_ms"] = bench(lambda: fla_dec(*args5, initial_state=S2, output_final_state=True),
                                     warmup=50, rep=300)
    print("decode:", res["decode_ours_ms"], res.get("decode_fla_ms"), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="e.g. benchmarks/results/kda/<date>_vs_fla_h200.json")
    ap.add_argument("--strong-decay", action="store_true", help="the strong-decay gradient check first")
    ap.add_argument("--shapes", default="all", help="'all' or a comma list of indices into SHAPES")
    ap.add_argument("--sweep", action="store_true", help="also time tile-config variants at (1, 16384, 16, 128)")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--no-decode", action="store_true", help="skip the one-token decode timing")
    ap.add_argument("--tiles", default="default", help="TileConfig: 'default', 'best:SWEEP.json' (a "
                    "benchmarks/kernels/kda_variants.py run), or overrides such as 'bwd_pairs_warps=4,state_warps=4'")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()

    from kernels.kda import kda_decode_step_, naive_recurrent_kda
    from kernels.kda.chunk_triton import chunk_kda_triton

    tiles = tile_config_from_arg(args.tiles)
    chunk_kda = functools.partial(chunk_kda_triton, tiles=tiles)
    torch.manual_seed(0)
    res = {
        "header": run_header(args.commit),
        "tile_config": dataclasses.asdict(tiles),
        "conventions": {"kda_flops_fwd_per_token_head": "2*(5*C*D + 3*D^2), C=64; fwd+bwd = 3x",
                        "bytes": "minimal IO: bf16 q,k,v,beta,o (+dO, dq,dk,dv,dbeta) and fp32 g (+dg)"},
    }
    fla_fn = fla_dec = None
    if not args.no_fla:
        try:
            import fla  # noqa: F401
            from fla.ops.kda import chunk_kda as fla_fn, fused_recurrent_kda as fla_dec
            res["fla"] = getattr(fla, "__version__", "unknown")
        except Exception as err:  # fla is optional: record why it is missing
            res["fla"] = None
            res["fla_import_error"] = repr(err)
    print(res["header"]["gpus"], res.get("fla"), flush=True)
    if args.strong_decay:
        fns = {"ours": chunk_kda} | ({"fla": fla_fn} if fla_fn is not None else {})
        res["strong_decay"] = strong_decay_errors(fns)
        for name, per_seed in res["strong_decay"].items():
            print("strong decay", name, {s: f"dg {e['dg']:.2e} o {e['o']:.2e}" for s, e in per_seed.items()}, flush=True)
        _write(res, args.out)

    res["bf16_matmul_tflops"], res["copy_TBps"] = ceilings()
    print(f"ceilings: {res['bf16_matmul_tflops']:.0f} TFLOP/s bf16, {res['copy_TBps']:.2f} TB/s copy", flush=True)

    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    # spot check against the fp32 reference before timing anything, at the first timed shape's heads
    # and width (fla compiles and autotunes per head width: one compile serves both)
    q, k, v, g, beta = make_inputs(1, 512, shapes[0][2], shapes[0][3], requires_grad=False)
    o_ref, _ = naive_recurrent_kda(q.float(), k.float(), v.float(), g, beta.float())
    res["ours_vs_naive_relerr"] = rel(chunk_kda(q, k, v, g, beta)[0], o_ref)
    if fla_fn is not None:
        res["fla_vs_naive_relerr"] = rel(fla_fn(q, k, v, g, beta)[0], o_ref)
    print("spot check rel err:", res["ours_vs_naive_relerr"], res.get("fla_vs_naive_relerr"), flush=True)

    # one-token decode first (cheap; a call cut short in the long shapes still has it)
    if not args.no_decode:
        _time_decode(res, kda_decode_step_, fla_dec)
    _write(res, args.out)

    rows = []
    for (B, T, H, D) in shapes:
        row = {"B": B, "T": T, "H": H, "D": D}
        row["ours_fwd_ms"], row["ours_fwdbwd_ms"], row["ours_infer_fwd_ms"] = time_kda(chunk_kda, B, T, H, D)
        if fla_fn is not None:
            try:
                row["fla_fwd_ms"], row["fla_fwdbwd_ms"], row["fla_infer_fwd_ms"] = time_kda(fla_fn, B, T, H, D)
                row["speedup_fwd_vs_fla"] = row["fla_fwd_ms"] / row["ours_fwd_ms"]
                row["speedup_fwdbwd_vs_fla"] = row["fla_fwdbwd_ms"] / row["ours_fwdbwd_ms"]
            except Exception as err:  # e.g. out of memory at the largest shape: keep our row
                row["fla_error"] = repr(err)[:500]
                torch.cuda.empty_cache()
        row["sdpa_fwd_ms"], row["sdpa_fwdbwd_ms"] = time_sdpa(B, T, H, D)
        fl = kda_flops_fwd(B, T, H, D)
        row["ours_fwd_tflops"] = fl / row["ours_fwd_ms"] / 1e9
        row["ours_fwdbwd_tflops"] = 3 * fl / row["ours_fwdbwd_ms"] / 1e9
        row["ours_fwd_GBps"] = kda_bytes(B, T, H, D, False) / row["ours_fwd_ms"] / 1e6
        row["ours_fwdbwd_GBps"] = kda_bytes(B, T, H, D, True) / row["ours_fwdbwd_ms"] / 1e6
        rows.append(row)
        print(json.dumps(row), flush=True)
        res["rows"] = rows
        _write(res, args.out)  # after every shape: a run cut short keeps what it measured
    res["rows"] = rows

    if args.sweep:
        from kernels.kda.triton.common import TileConfig

        variants = {"default": TileConfig(), "state_warps4": TileConfig(state_warps=4),
                    "state_bv16": TileConfig(state_block_v=16), "bwd_bks64": TileConfig(bwd_key_slice=64)}
        sweep = {}
        for name, cfg in variants.items():
            try:
                sweep[name] = time_kda(functools.partial(chunk_kda_triton, tiles=cfg), 1, 16384, 16, 128)
            except Exception as err:
                sweep[name] = repr(err)
            print("sweep", name, sweep[name], flush=True)
        res["sweep_1x16384x16x128"] = sweep

    _write(res, args.out)
    print(f"{'shape':>22} {'ours fwd':>9} {'fla fwd':>8} {'ours f+b':>9} {'fla f+b':>8} {'x fla':>6} {'sdpa f+b':>9}")
    for r in rows:
        print(f"{str((r['B'], r['T'], r['H'], r['D'])):>22} {r['ours_fwd_ms']:9.2f} {r.get('fla_fwd_ms', math.nan):8.2f} "
              f"{r['ours_fwdbwd_ms']:9.2f} {r.get('fla_fwdbwd_ms', math.nan):8.2f} "
              f"{r.get('speedup_fwdbwd_vs_fla', math.nan):6.2f} {r['sdpa_fwdbwd_ms']:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
