"""Where the MXFP4 GEMV's time goes at M = 1: floors measured in one process, and Nsight Compute.

    PYTHONPATH=. python3 benchmarks/probes/mx_probe.py --out $OUT/mx_probe_h200.json
    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \
        python3 benchmarks/probes/mx_probe.py --ncu          # one launch of each kernel, for the profiler
    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/probes/mx_probe.py --smoke --out /tmp/p.json  (CPU)

Written when the GEMV (kernels.mx, dense 7168 x 7168, 27.3 MB of codes and scales) was stuck at
57-59 % of the copy bandwidth and 2.0x bf16, and neither fewer instructions (f16x2), one launch
instead of two (in-kernel split-K) nor a loop without barriers made it faster; its ncu run showed an
issue-bound kernel, which led to today's default (docs/log/mx.md, session 4). It measures, timed the way benchmarks/mx.py times (CUDA-graph replay over enough weight copies
that every call reads from HBM):
- stream: a plain Triton read of the same bytes (int32 words summed), one program per SM times a
  few, 16 bytes per thread per load: how fast 27.3 MB can be read at all by one kernel;
- bf16 torch.matmul at M = 1 on a weight of the same byte count (K = 7168, N = 1904) and on 7168^2:
  what cuBLAS's GEMV reaches on that many bytes;
- the default GEMV (both kernels), and the split-K reduction kernel alone;
- the same streaming read on the expert shapes' codes, and a launch that reads 32 bytes.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from benchmarks.common import MX_SHAPES as SHAPES
from benchmarks.common import mx_problem as _make_problem
from benchmarks.common import run_header, time_calls
from benchmarks.common import weight_copies as _copies
from kernels.mx.triton.common import _reduce_splits, _sm_count, _split_plan
from kernels.mx.triton.gemv import default_gemv_config, mx_gemv

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CPU box has triton
    triton = None

K = N = 7168


if triton is not None:
    @triton.jit
    def _stream_probe_kernel(words, out, n_words, per_prog, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        """Sum the int32 words [pid * per_prog, (pid + 1) * per_prog), BLOCK per iteration."""
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        base = pid.to(tl.int64) * per_prog
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in range(ITERS):
            idx = base + i * BLOCK + offs
            acc ^= tl.load(words + idx, mask=(idx < n_words) & (i * BLOCK + offs < per_prog), other=0)
        tl.store(out + pid, tl.xor_sum(acc, axis=0))


def stream_read(words: torch.Tensor, out: torch.Tensor, programs: int, block: int, num_warps: int) -> None:
    n = words.numel()
    per = -(-n // programs)
    per = -(-per // block) * block
    _stream_probe_kernel[(programs,)](words, out, n, per, BLOCK=block, ITERS=per // block,
                                      num_warps=num_warps)


def _ms_over_copies(make_fns, nbytes: int, l2: int) -> float:
    return time_calls(make_fns(_copies(nbytes, l2)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--ncu", action="store_true", help="one launch of each kernel between profiler start/stop")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, CPU interpreter")
    ap.add_argument("--shape", default="dense_7168", choices=list(SHAPES),
                    help="with --ncu: the weight shape (benchmarks/mx.py SHAPES)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    k = n = 256 if args.smoke else K
    if args.ncu:
        k, n = SHAPES[args.shape]
    sms = _sm_count(dev)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size if dev.type == "cuda" else 2**20

    x, wq = _make_problem(1, k, n, dev, seed=0)
    codes, scales = wq.codes, wq.scales
    nbytes = codes.numel() + scales.numel()
    cfg = default_gemv_config(n, k, dev)
    per, splits = _split_plan(scales.shape[1], cfg.groups, cfg.split_k)
    out = torch.empty((1, n), device=dev, dtype=torch.bfloat16)
    words = codes.view(torch.int32).reshape(-1)
    sink = torch.empty(sms * 64, device=dev, dtype=torch.int32)
    stream_cfgs = [(sms * c, b, w) for c in (1, 2, 4, 8) for b, w in ((2048, 4), (4096, 8))]
    if args.smoke:
        stream_cfgs = stream_cfgs[:2]

    if args.ncu:
        mx_gemv(x, codes, scales, k, None, out, cfg)
        stream_read(words, sink, *stream_cfgs[2])
        wb = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        torch.matmul(x, wb.t())
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        mx_gemv(x, codes, scales, k, None, out, cfg)
        for c in stream_cfgs[2:4]:
            stream_read(words, sink, *c)
        torch.matmul(x, wb.t())
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print("ncu launches done")
        return 0

    result = {"env": run_header(), "shape": [k, n], "bytes": nbytes, "gemv_config": str(cfg),
              "splits": splits, "rows": {}}
    rows = result["rows"]

    def record(name: str, ms: float, moved: int) -> None:
        rows[name] = {"us": round(ms * 1e3, 3), "GBps": round(moved / ms / 1e6, 1)}
        print(f"{name:40s} {ms * 1e3:8.2f} us  {moved / ms / 1e6:8.1f} GB/s", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    copies = _copies(nbytes, l2)
    wqs = [wq] + [_make_problem(1, k, n, dev, seed=i + 1)[1] for i in range(copies - 1)]
    outs = [torch.empty_like(out) for _ in wqs]
    record("gemv_default (both kernels)",
           time_calls([lambda w=w, o=o: mx_gemv(x, w.codes, w.scales, k, None, o, cfg) for w, o in zip(wqs, outs)]),
           nbytes)
    partials = [torch.empty((splits, 1, n), device=dev, dtype=torch.float32) for _ in wqs]
    record("gemv reduce kernel alone", time_calls([lambda p=p, o=o: _reduce_splits(p, None, o)
                                                   for p, o in zip(partials, outs)]), splits * n * 4 + n * 2)
    want = np.bitwise_xor.reduce(words.cpu().numpy())
    for c in stream_cfgs:  # the probe must really read every word once
        sink.zero_()
        stream_read(words, sink, *c)
        got = np.bitwise_xor.reduce(sink[:c[0]].cpu().numpy())
        assert got == want, f"stream probe {c} read the wrong words"
    for c in stream_cfgs:
        wl = [w.codes.view(torch.int32).reshape(-1) for w in wqs]
        record(f"stream programs={c[0]} block={c[1]} warps={c[2]}",
               time_calls([lambda w=w: stream_read(w, sink, *c) for w in wl]), codes.numel())
    # The floors for the expert-sized weights (benchmarks/mx.py SHAPES): a streaming read of their
    # codes at the best stream configs above, and a launch that reads almost nothing.
    for shape, (ks, ns) in (() if args.smoke else SHAPES.items()):
        ws = [torch.randint(-2**31, 2**31 - 1, (ns * ks // 8,), device=dev, dtype=torch.int32)
              for _ in range(_copies(ns * ks // 2, l2))]
        for c in ((sms * 4, 4096, 8), (sms * 8, 4096, 8), (sms * 2, 2048, 4)):
            record(f"stream {shape} programs={c[0]} block={c[1]} warps={c[2]}",
                   time_calls([lambda w=w: stream_read(w, sink, *c) for w in ws]), ns * ks // 2)
    tiny = torch.zeros(8, device=dev, dtype=torch.int32)
    record("launch floor (one program, 8 words)", time_calls([lambda: stream_read(tiny, sink, 1, 64, 2)] * 8), 32)
    for name, nn in (("bf16 matmul M=1 same bytes (N=1904)", 1904 if not args.smoke else 64), ("bf16 matmul M=1 7168^2", n)):
        wb = [torch.randn(nn, k, device=dev, dtype=torch.bfloat16) for _ in range(_copies(nn * k * 2, l2))]
        record(name, time_calls([lambda w=w: torch.matmul(x, w.t()) for w in wb]), nn * k * 2)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
