"""AttnRes's depth mix on the GPU: the Triton op (kernels/attn_res/triton.py) against Inductor's kernels
for the torch formula, forward and forward+backward.

The Inductor peer is torch.compile of a copy of the torch formula in its compiled form (the stacked
product of `AttnRes._mix_torch` under torch.compile): what the model's compiled regions ran before
the Triton op. Shapes: M = 32,768 and 65,536 rows, D = 1024, N = 2 and 3 bf16 sources, a nonzero
query. Before timing, each shape's h and gradients (sources, query, key norm weight) of the two are
compared (relative RMS error, the Triton op against the peer). Times are medians of
`triton.testing.do_bench` (L2 flushed between calls); forward+backward is one `torch.autograd.grad`
of h with a fixed dh, grad mode on in both as in training. Caution: on the H200 the eager Triton op's
forward + backward is paced by the host (torch.library's autograd layer and Triton's launcher: the same
0.7–1.0 ms at 32,768 and 65,536 rows, session 19), so these figures compare host paths, not kernels;
`probes-archive:benchmarks/probes/glue_graph_time.py` times the device alone (CUDA-graph replay).

The bandwidth floor is the bytes that must move over 4.8 TB/s (the H200's HBM3e peak): the forward
reads N sources and writes h, (N + 1)·M·D·2 bytes; the backward reads N sources and dh and writes N
source gradients, (2N + 1)·M·D·2 bytes (the query's and key norm's [D] vectors are negligible).

Usage (device machine): PYTHONPATH=. python benchmarks/kernels/attn_res.py --out $OUT/attn_res_h200.json
    [--tiles ROW_TILE=1024,BWD_ROWS_PER_PROGRAM=32]   (kernels/attn_res/triton.py's module constants)
On the CPU: PYTHONPATH=. TRITON_INTERPRET=1 python benchmarks/kernels/attn_res.py --quick --out /tmp/attn_res.json — a tiny
shape, each path run once and compared, no timing; the peer compiled with aot_eager (no codegen).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch

from benchmarks.common import ROOT, close_report, run_header, write_json

SHAPES = [(32768, 1024, 2), (32768, 1024, 3), (65536, 1024, 2), (65536, 1024, 3)]  # (M, D, N)
QUICK_SHAPES = [(38, 64, 2), (38, 64, 3)]
HBM_BYTES_PER_S = 4.8e12
EPS = 1e-6


def torch_mix(sources: list[torch.Tensor], query_D: torch.Tensor, key_weight_D: torch.Tensor) -> torch.Tensor:
    """AttnRes's torch formula as its compiled regions ran it (`_alpha` and the stacked branch of
    `_mix_torch`), copied here so that torch.compile sees only it."""
    v_list = [v.float() for v in sources]
    wq_D = key_weight_D.float() * query_D.float()
    logits_NM = torch.stack([torch.rsqrt(v.pow(2).mean(-1) + EPS) * (v * wq_D).sum(-1) for v in v_list])
    alpha_NM = logits_NM.softmax(0)
    return (alpha_NM.unsqueeze(-1) * torch.stack(v_list)).sum(0).to(sources[0].dtype)


def triton_mix(sources, query_D, key_weight_D):
    from kernels.attn_res import attn_res_mix_triton

    return attn_res_mix_triton(sources, query_D, key_weight_D, EPS)


def floor_us(M: int, D: int, N: int, backward: bool) -> float:
    rows_moved = (N + 1) + ((2 * N + 1) if backward else 0)
    return rows_moved * M * D * 2 / HBM_BYTES_PER_S * 1e6


def make_inputs(M: int, D: int, N: int, dev: torch.device, seed: int = 0):
    gen = torch.Generator(device=dev).manual_seed(seed)
    sources = [(torch.randn(M, D, device=dev, generator=gen) * (1 + i)).to(torch.bfloat16).requires_grad_(True)
               for i in range(N)]
    query = (0.5 * torch.randn(D, device=dev, generator=gen)).requires_grad_(True)
    key_weight = (0.5 + torch.rand(D, device=dev, generator=gen)).requires_grad_(True)
    dh = torch.randn(M, D, device=dev, generator=gen).to(torch.bfloat16)
    return sources, query, key_weight, dh


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_shape(M: int, D: int, N: int, dev: torch.device, peer, quick: bool) -> dict:
    sources, query, key_weight, dh = make_inputs(M, D, N, dev)
    leaves = sources + [query, key_weight]
    row: dict = {"M": M, "D": D, "N": N, "dtype": "bfloat16"}

    def fwd(fn):
        return lambda: fn(sources, query, key_weight)

    def fwd_bwd(fn):
        return lambda: torch.autograd.grad(fn(sources, query, key_weight), leaves, dh)

    outs = {}
    for name, fn in (("triton", triton_mix), ("inductor", peer)):
        h = fn(sources, query, key_weight)
        outs[name] = [h.detach()] + list(torch.autograd.grad(h, leaves, dh))
    grad_names = ["h"] + [f"dv{i}" for i in range(N)] + ["dquery", "dkey_weight"]
    row["rel_err_triton_vs_inductor"] = {n: rel(a, b) for n, a, b in
                                         zip(grad_names, outs["triton"], outs["inductor"])}
    if quick:
        return row
    from triton.testing import do_bench

    row["floor_us"] = {"fwd": round(floor_us(M, D, N, False), 1), "fwd_bwd": round(floor_us(M, D, N, True), 1)}
    row["us"] = {}
    for name, fn in (("triton", triton_mix), ("inductor", peer)):
        row["us"][name] = {"fwd": round(1e3 * do_bench(fwd(fn), return_mode="median"), 1),
                           "fwd_bwd": round(1e3 * do_bench(fwd_bwd(fn), return_mode="median"), 1)}
    row["x_floor"] = {name: {k: round(t / row["floor_us"][k], 2) for k, t in times.items()}
                      for name, times in row["us"].items()}
    row["speedup_vs_inductor"] = {k: round(row["us"]["inductor"][k] / row["us"]["triton"][k], 2)
                                  for k in ("fwd", "fwd_bwd")}
    return row


def apply_tiles(text: str) -> dict:
    """--tiles NAME=VALUE,... set on kernels/attn_res/triton.py (its module constants)."""
    import kernels.attn_res.triton as kt

    names = ("ROW_TILE", "MAX_BLOCK_D", "VALUES_PER_THREAD", "BWD_ROWS_PER_PROGRAM")
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in names:
            raise ValueError(f"--tiles {item!r}: expected NAME=VALUE with NAME one of {', '.join(names)}")
        setattr(kt, name, int(value))
    return {name: getattr(kt, name) for name in names}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="e.g. benchmarks/results/train/<date>_attn_res_h200.json")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, run once, no timing (CPU: TRITON_INTERPRET=1)")
    ap.add_argument("--tiles", default="", help="NAME=VALUE,... for kernels/attn_res/triton.py's tile constants")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    if torch.cuda.is_available():
        dev, backend = torch.device("cuda"), "inductor"
    elif args.quick and os.environ.get("TRITON_INTERPRET") == "1":
        dev, backend = torch.device("cpu"), "aot_eager"
        # The interpreter needs the shims of tests/kernels/kda/conftest.py (NumPy ≥ 2.4, bf16 rounding).
        sys.path.insert(0, os.path.join(ROOT, "tests", "kernels", "kda"))
        import conftest  # noqa: F401  (patches the interpreter on import)
    else:
        raise SystemExit("benchmarks/kernels/attn_res.py needs a CUDA GPU (or --quick with TRITON_INTERPRET=1)")
    report = {"env": run_header(args.commit), "method": " ".join(__doc__.split("\n\n")[1:3]).replace("\n", " "),
              "compile_backend": backend, "tiles": apply_tiles(args.tiles), "rows": [], "status": "running"}

    def dump():
        write_json(args.out, report)

    t0 = time.perf_counter()
    try:
        # Static shapes: Inductor's best case, a kernel specialized to each shape.
        peer = torch.compile(torch_mix, backend=backend, dynamic=False)
        for M, D, N in QUICK_SHAPES if args.quick else SHAPES:
            row = run_shape(M, D, N, dev, peer, args.quick)
            report["rows"].append(row)
            print(row, flush=True)
            dump()
        error = None
    except Exception:
        error = traceback.format_exc()
    return close_report(report, t0, dump, error)


if __name__ == "__main__":
    sys.exit(main())
