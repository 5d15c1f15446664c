"""The KDA short conv + SiLU (+ per-head L2 norm of q and k) on CUDA: the Triton op
(`kernels/short_conv/triton.py`) against its Inductor peer, what the model ran before it — torch.compile
of the tap sum (`naive.short_conv_silu_taps`) followed by the torch L2 formula in fp32 and the cast
back to bf16 — forward and forward + backward (x and weight gradients), bf16 activations with an fp32
weight, W = 4, head_dim 128, at (64, 512, 1024) and (1, 65536, 1024). The plain conv + SiLU (the v
path) is timed the same way. Times are triton.testing.do_bench medians; the floor is the bytes the op
must move (x and y forward; x, dy and dx more backward) over 4.8 TB/s. Caution: on the H200 the eager
Triton op's forward + backward is paced by the host (0.6–1.0 ms, session 19); the device alone:
`probes-archive:benchmarks/probes/glue_graph_time.py` (CUDA-graph replay).

    PYTHONPATH=. python benchmarks/kernels/short_conv.py --out benchmarks/results/train/<date>_short_conv_h200.json
    PYTHONPATH=. TRITON_INTERPRET=1 python benchmarks/kernels/short_conv.py --quick    # CPU smoke: tiny shape, once, untimed
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

from benchmarks.common import close_report, run_header, write_json

SHAPES = [(64, 512, 1024), (1, 65536, 1024)]
HEAD_DIM, TAPS, HBM_TBPS = 128, 4, 4.8


def inductor_peer(head_dim: int):
    """The tap sum, then (head_dim > 0) the fp32 L2 norm and the cast back, as kda_layer ran them."""
    from kernels.short_conv.naive import short_conv_silu_taps

    def peer(x_BTC, weight_C1W):
        y_BTC, _ = short_conv_silu_taps(x_BTC, weight_C1W, None)
        if not head_dim:
            return y_BTC
        y_BTHK = y_BTC.float().unflatten(-1, (-1, head_dim))
        y_BTHK = y_BTHK * torch.rsqrt((y_BTHK * y_BTHK).sum(-1, keepdim=True).clamp_min(1e-12))
        return y_BTHK.flatten(-2).to(x_BTC.dtype)
    return peer


def floor_us(B: int, T: int, C: int, itemsize: int, backward: bool) -> float:
    tensors = 5 if backward else 2  # x, y (+ x, dy, dx)
    return tensors * B * T * C * itemsize / (HBM_TBPS * 1e12) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="e.g. benchmarks/results/train/<date>_short_conv_h200.json")
    ap.add_argument("--quick", action="store_true", help="a tiny shape, each call once, untimed (CPU smoke)")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()

    from kernels.short_conv.triton import short_conv_silu_triton

    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        raise SystemExit("needs CUDA (or --quick under TRITON_INTERPRET=1)")
    dev = "cuda" if cuda else "cpu"
    t_start = time.perf_counter()
    report = run_header(args.commit)
    report.update({"benchmark": "short_conv", "taps": TAPS, "head_dim": HEAD_DIM, "dtype": "bfloat16",
                   "weight_dtype": "float32", "hbm_TBps_for_floor": HBM_TBPS,
                   "timing": "triton.testing.do_bench median, ms per call; fwdbwd = forward + autograd.grad "
                             "of x and the weight", "rows": []})
    dump = (lambda: write_json(args.out, report)) if args.out else (lambda: None)
    shapes = [(2, 9, 256)] if args.quick else SHAPES
    # The CPU smoke has no C++ toolchain guarantee for Inductor; aot_eager still traces the same graph.
    backend = "inductor" if cuda else "aot_eager"
    error = None
    try:
        for B, T, C in shapes:
            gen = torch.Generator(device=dev).manual_seed(0)
            x = torch.randn(B, T, C, device=dev, generator=gen).to(torch.bfloat16).requires_grad_()
            w = (torch.randn(C, 1, TAPS, device=dev, generator=gen) * 0.5).requires_grad_()
            dy = torch.randn(B, T, C, device=dev, generator=gen).to(torch.bfloat16)
            for head_dim in (HEAD_DIM, 0):
                torch._dynamo.reset()
                fns = {"triton": lambda a, b, hd=head_dim: short_conv_silu_triton(a, b, hd),
                       "inductor": torch.compile(inductor_peer(head_dim), backend=backend)}
                row = {"B": B, "T": T, "C": C, "l2_norm": head_dim > 0,
                       "floor_fwd_us": floor_us(B, T, C, 2, False), "floor_fwdbwd_us": floor_us(B, T, C, 2, True)}
                outs = {}
                for name, fn in fns.items():
                    def fwd(fn=fn):
                        with torch.no_grad():
                            return fn(x, w)

                    def fwdbwd(fn=fn):
                        return torch.autograd.grad(fn(x, w), (x, w), dy)

                    outs[name] = (fwd(), *fwdbwd())
                    if not args.quick:
                        from triton.testing import do_bench

                        for label, call in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                            row[f"{name}_{label}_us"] = do_bench(call, warmup=25, rep=200, return_mode="median") * 1e3
                # The two agree to bf16 rounding (the peer rounds the conv's output to bf16 before the norm).
                for i, label in enumerate(("y", "dx", "dw")):
                    a, b = outs["triton"][i].double(), outs["inductor"][i].double()
                    row[f"rel_diff_{label}"] = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
                if not args.quick:
                    for label in ("fwd", "fwdbwd"):
                        row[f"speedup_{label}"] = row[f"inductor_{label}_us"] / row[f"triton_{label}_us"]
                        row[f"triton_{label}_frac_of_floor"] = row[f"floor_{label}_us"] / row[f"triton_{label}_us"]
                report["rows"].append(row)
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
                dump()
    except Exception:
        error = traceback.format_exc()
    return close_report(report, t_start, dump, error)


if __name__ == "__main__":
    sys.exit(main())
