"""Where a training step's time goes: torch.profiler over one K3 forward+backward+AdamW step.

    PYTHONPATH=. python3 benchmarks/profile_step.py --profile small --seq-len 512 --tokens 65536 --out prof.json

Writes the top operators by device time and by host time (self time, so nothing is counted twice),
the step's wall time, and how many kernels it launched. Random tokens, as benchmarks/train_step.py.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.train_step import k3_train_step
from k3model.config import get_profile
from k3model.model import K3Model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="small")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = replace(get_profile(args.profile).model, vision=None, mtp_depth=0)
    torch.manual_seed(0)
    model = K3Model(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    ids = torch.randint(0, cfg.vocab_size, (max(args.tokens // args.seq_len, 1), args.seq_len), device=device)

    def step():
        k3_train_step(model, opt, ids, lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"))

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(2):
        step()
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    wall = time.perf_counter() - t0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        sync()
    events = prof.key_averages()
    dev_attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"

    def rows(attr):
        ranked = sorted(events, key=lambda e: getattr(e, attr), reverse=True)[:args.top]
        return [{"op": e.key, "calls": e.count, "self_ms": getattr(e, attr) / 1e3} for e in ranked]

    res = {
        "profile": args.profile, "seq_len": args.seq_len, "tokens": args.tokens, "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "torch": torch.__version__,
        "step_wall_s": wall,
        "device_ms_total": sum(getattr(e, dev_attr) for e in events) / 1e3,
        "host_ms_total_self": sum(e.self_cpu_time_total for e in events) / 1e3,
        "kernel_launches": sum(e.count for e in events if getattr(e, dev_attr) > 0 and e.device_type.name == "CUDA"),
        "top_by_device_time": rows(dev_attr),
        "top_by_host_time": rows("self_cpu_time_total"),
    }
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"step {wall:.2f} s; device {res['device_ms_total']:.0f} ms; host {res['host_ms_total_self']:.0f} ms")
    for r in res["top_by_device_time"][:20]:
        print(f"  {r['self_ms']:9.1f} ms {r['calls']:6d}x  {r['op'][:90]}")
    print("host:")
    for r in res["top_by_host_time"][:12]:
        print(f"  {r['self_ms']:9.1f} ms {r['calls']:6d}x  {r['op'][:90]}")


if __name__ == "__main__":
    main()
