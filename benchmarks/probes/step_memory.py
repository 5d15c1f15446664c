"""Two questions about the small profile's CUDA training step (issue 22 item 3):

1. What does activation checkpointing cost, and does the step fit without it? For each mode —
   `all` (every layer recomputed in the backward, the profile's setting), `alternate` (every other
   layer), `none` — the step time and the peak memory, on one regionally compiled model.
2. Who calls the eager fp32 elementwise kernels and the host synchronisations left between the
   compiled regions? One profiled step with Python stacks: the top aten ops by device time and every
   synchronising op, each with its innermost project frames.

    PYTHONPATH=$PWD python3 benchmarks/probes/step_memory.py --out step_memory.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch
import torch._dynamo
from torch.profiler import ProfilerActivity, profile

from benchmarks.train_step import k3_train_step
from k3model.compiled import compile_regions
from k3model.config import get_profile
from k3model.model import K3Model

MODES = {"all": lambda i: True, "alternate": lambda i: i % 2 == 0, "none": lambda i: False}
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "aten::nonzero",
            "aten::tolist", "cudaMemcpyAsync")


def project_frames(stack: list[str], n: int = 3) -> list[str]:
    """The innermost `n` frames that are this project's code (not torch's)."""
    return [f for f in stack if f.startswith(("k3model/", "kernels/", "benchmarks/"))][:n]


def stacks(model, opt, ids, ctx, top: int) -> dict:
    """Aggregate one profiled step's aten ops by (op, innermost project frames) — or, for the
    backward's ops (no Python stack), by (op, input shapes and dtypes)."""
    from collections import defaultdict

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True, record_shapes=True,
                 experimental_config=torch._C._profiler._ExperimentalConfig(verbose=True)) as prof:
        k3_train_step(model, opt, ids, ctx)
        torch.cuda.synchronize()
    groups = defaultdict(lambda: {"calls": 0, "device_ms": 0.0, "host_ms": 0.0})
    for e in prof.events():
        if not (e.name.startswith("aten::") or e.name in SYNC_OPS):
            continue
        stack = list(e.stack or [])
        frames = project_frames(stack)
        where = " < ".join(stack[:1] + [f for f in frames if f not in stack[:1]]) if frames else "no stack; inputs " + str(
            list(zip(e.input_shapes or [], getattr(e, "input_dtypes", None) or [])))[:160]
        g = groups[(e.name, where)]
        g["calls"] += 1
        g["device_ms"] += e.self_device_time_total / 1e3
        g["host_ms"] += e.self_cpu_time_total / 1e3
    rows = [{"op": op, "where": where, **g} for (op, where), g in groups.items()]
    by_device = sorted((r for r in rows if r["device_ms"] > 0), key=lambda r: -r["device_ms"])[:top]
    syncs = sorted((r for r in rows if r["op"] in SYNC_OPS), key=lambda r: -r["calls"])
    return {"top_aten_by_device": by_device, "syncs": syncs}


def k3model_compiled_limit() -> int:
    import k3model.compiled

    return k3model.compiled.RECOMPILE_LIMIT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="small")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--modes", default="all,alternate,none")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--no-stacks", action="store_true")
    ap.add_argument("--recompile-limit", type=int, default=None, help="Dynamo's, in place of compiled.RECOMPILE_LIMIT")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = replace(get_profile(args.profile).model, vision=None, mtp_depth=0)
    if args.recompile_limit:
        import k3model.compiled

        k3model.compiled.RECOMPILE_LIMIT = args.recompile_limit
        if hasattr(torch._dynamo.config, "accumulated_recompile_limit"):
            torch._dynamo.config.accumulated_recompile_limit = max(
                torch._dynamo.config.accumulated_recompile_limit, 8 * args.recompile_limit)
    torch.manual_seed(0)
    model = compile_regions(K3Model(cfg).cuda(), dynamic=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, cfg.vocab_size, (args.tokens // args.seq_len, args.seq_len), device="cuda")
    ctx = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    res = {"profile": args.profile, "seq_len": args.seq_len, "tokens": args.tokens,
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "modes": {},
           "recompile_limit": k3model_compiled_limit()}
    for mode in args.modes.split(","):
        for i, block in enumerate(model.layers):
            block.activation_checkpointing = MODES[mode](i)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        row = {}
        try:
            t0 = time.perf_counter()
            for _ in range(2):
                k3_train_step(model, opt, ids, ctx)
            torch.cuda.synchronize()
            row["warmup_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(args.reps):
                k3_train_step(model, opt, ids, ctx)
            torch.cuda.synchronize()
            row["step_s"] = (time.perf_counter() - t0) / args.reps
            row["tokens_per_s"] = args.tokens / row["step_s"]
            row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
        except torch.OutOfMemoryError as e:
            row["error"] = f"out of memory: {e}"[:300]
            opt.zero_grad(set_to_none=True)
        res["modes"][mode] = row
        print(mode, json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    if not args.no_stacks:
        for i, block in enumerate(model.layers):
            block.activation_checkpointing = True
        res["stacks"] = stacks(model, opt, ids, ctx, args.top)
        for r in res["stacks"]["top_aten_by_device"][:25]:
            print(f"{r['device_ms']:8.1f} ms {r['calls']:5d}x {r['op']:24s} {r['where'][:150]}")
        print("syncs:")
        for r in res["stacks"]["syncs"][:25]:
            print(f"{r['calls']:5d}x {r['op']:24s} {r['host_ms']:7.1f} host ms {r['where'][:150]}")
    from torch._dynamo.utils import counters

    res["dynamo_counters"] = {k: {str(kk): vv for kk, vv in v.items()} for k, v in counters.items()}
    print({k: sum(v.values()) for k, v in res["dynamo_counters"].items()})
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
