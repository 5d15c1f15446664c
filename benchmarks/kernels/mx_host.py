"""Host time of one eager call of kernels.mx.mx_linear / mx_linear_experts at decode, against bf16 torch peers.

    PYTHONPATH=. python3 benchmarks/kernels/mx_host.py --out $OUT/mx_host_h200.json

An eager decode loop pays every op's host time (Python, argument checks, allocation, launches) unless
the GPU is slower. Per op, in one process:
- host_us: N calls issued back to back with no synchronisation, over N (after a synchronise): the
  CPU's time to enqueue one call. N = 200 keeps the launch queue (about 1024 entries) from filling,
  so the CPU never waits for the GPU inside the window;
- eager_us: the same N calls and a final synchronise, over N: what an eager loop of this op costs;
- gpu_us: the same calls replayed from a CUDA graph (no host work): the kernels' own time.
Ops: mx_linear at M = 1 on 7168 x 7168 and on a k3 expert (3584 -> 3072), mx_linear_experts for a
token's 16 routed experts of a stack of 64 (3584 -> 3072, one x row shared), and their bf16 peers
(torch.nn.functional.linear on the bf16 weight; torch.bmm over the 16 experts' bf16 weights stored
contiguously). For mx_linear on 7168^2 also the parts: the GEMV through the Triton JIT's launch
(mx_gemv with its config), the cached launch alone (gemv_decode), and two torch.empty calls.
Before timing, every MX output is checked against the plain launch (bitwise) so the cached path is
known to compute the same thing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from benchmarks.common import close_report, mx_problem, run_header, time_calls, write_json

N_CALLS = 200
ROUNDS = 7  # medians over rounds


def host_and_eager_us(fn, n=N_CALLS, rounds=ROUNDS) -> dict:
    hosts, eagers = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hosts.append((t1 - t0) / n * 1e6)
        eagers.append((t2 - t0) / n * 1e6)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"host_us": round(med(hosts), 2), "eager_us": round(med(eagers), 2),
            "host_us_all": [round(h, 2) for h in hosts]}


def measure(name, fn, report, extra=None):
    for _ in range(20):  # compile, fill caches, warm clocks
        fn()
    row = {"op": name, **host_and_eager_us(fn), "gpu_us": round(time_calls([fn] * 50, reps=10) * 1e3, 2),
           **(extra or {})}
    report["rows"].append(row)
    print(f"{name:44s} host {row['host_us']:7.2f} us  eager {row['eager_us']:7.2f} us  gpu {row['gpu_us']:7.2f} us",
          flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/kernels/mx_host.py measures CUDA launches: it needs a GPU")
    from kernels.mx import mx_linear, mx_linear_experts, quantize_mx
    from kernels.mx.triton import gemv

    report = {"header": run_header(args.commit), "method": __doc__.split("\n\n", 2)[2], "n_calls": N_CALLS,
              "rounds": ROUNDS, "rows": [], "checks": {}, "status": "running"}
    t_start = time.perf_counter()
    dev = torch.device("cuda")
    try:
        with torch.no_grad():
            for label, (k, n) in {"dense_7168": (7168, 7168), "expert_3584_3072": (3584, 3072)}.items():
                x, wq = mx_problem(1, k, n, dev, seed=k + n)
                want = torch.empty((1, n), device=dev, dtype=torch.bfloat16)
                cfg = gemv.default_gemv_config(n, k, dev)
                gemv.mx_gemv(x, wq.codes, wq.scales, k, None, want, cfg)
                report["checks"][f"mx_linear/{label}"] = bool(torch.equal(mx_linear(x, wq), want))
                if not report["checks"][f"mx_linear/{label}"]:
                    raise AssertionError(f"mx_linear != mx_gemv for {label}")
                w_bf = wq.dequantize(torch.bfloat16)
                peer = measure(f"bf16 F.linear M=1 {label}", lambda: F.linear(x, w_bf), report)
                mine = measure(f"mx_linear M=1 {label}", lambda: mx_linear(x, wq), report,
                               {"splits": gemv._split_plan(k // 32, cfg.groups, cfg.split_k)[1]})
                mine["host_vs_bf16_peer"] = round(mine["host_us"] / peer["host_us"], 2)
                if label == "dense_7168":
                    out = torch.empty((1, n), device=dev, dtype=torch.bfloat16)
                    measure(f"  part: mx_gemv through the JIT launch {label}",
                            lambda: gemv.mx_gemv(x, wq.codes, wq.scales, k, None, out, cfg), report)
                    measure(f"  part: gemv_decode (cached launch) {label}",
                            lambda: gemv.gemv_decode(x, wq.codes, wq.scales, k, None, torch.bfloat16), report)
                    measure("  part: two torch.empty", lambda: (torch.empty((1, n), device=dev, dtype=torch.bfloat16),
                                                              torch.empty((8, 1, n), device=dev)), report)

            e, top_k, k, n = 64, 16, 3584, 3072
            g = torch.Generator(device=dev).manual_seed(5)
            experts = [quantize_mx(torch.randn(n, k, device=dev, generator=g) / k**0.5, "fp4_e2m1") for _ in range(e)]
            stack = dataclasses.replace(experts[0], codes=torch.stack([w.codes for w in experts]),
                                        scales=torch.stack([w.scales for w in experts]), shape=(e, n, k))
            ids = torch.randperm(e, generator=torch.Generator().manual_seed(1))[:top_k].to(torch.int32).to(dev)
            x = torch.randn(1, k, device=dev).to(torch.bfloat16).expand(top_k, k)
            want = torch.empty((top_k, n), device=dev, dtype=torch.bfloat16)
            gemv.mx_gemv_grouped(x, stack.codes, stack.scales, ids, k, want)
            report["checks"]["mx_linear_experts"] = bool(torch.equal(mx_linear_experts(x, stack, ids), want))
            if not report["checks"]["mx_linear_experts"]:
                raise AssertionError("mx_linear_experts != mx_gemv_grouped")
            w_bf = torch.stack([experts[i].dequantize(torch.bfloat16) for i in ids.tolist()])  # [16, N, K]
            xb = x[:, None, :]
            peer = measure("bf16 torch.bmm 16 experts 3584->3072", lambda: torch.bmm(xb, w_bf.transpose(1, 2)), report)
            mine = measure("mx_linear_experts 16 of 64 experts 3584->3072", lambda: mx_linear_experts(x, stack, ids),
                           report)
            mine["host_vs_bf16_peer"] = round(mine["host_us"] / peer["host_us"], 2)
        error = None
    except Exception:
        error = traceback.format_exc()
    return close_report(report, t_start, lambda: write_json(args.out, report), error)


if __name__ == "__main__":
    sys.exit(main())
