"""Where a training step's time goes: torch.profiler over one K3 forward+backward+AdamW step.

    PYTHONPATH=. python3 benchmarks/model/profile_step.py --profile small --seq-len 512 --tokens 65536 --out prof.json

Writes the top operators by device time and by host time (self time, so nothing is counted twice),
the step's wall time, and how many kernels it launched. Random tokens, as benchmarks/model/train_step.py.

`--by-module` adds time and operator counts per module kind (KDA, MLA, LatentMoE, dense FFN,
AttnRes, RMSNorm, the LM head with its loss, AdamW): each module's inputs are caught during one
real forward, then its forward + backward is profiled on them in isolation, so backward work is
attributed too (the autograd engine's own ops carry no module). On the CPU this is the table that
decided issue 17's changes (docs/log/tiny.md).

`--attribute` adds the device time per module kind, forward and backward, inside the real step
(compiled regions included): each module kind's eager call opens a profiler range, and a chrome
trace of the step is parsed (see `attribute`), and where the device sat idle in the step (gaps between
kernels by size, and whether the host launched the next kernel late: `device_idle`). `--checkpointing` and `--micro-batches` set the step
as benchmarks/model/train_step.py does:

    PYTHONPATH=. python3 benchmarks/model/profile_step.py --compile-regions --checkpointing off --micro-batches 2 \
        --attribute --out prof.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import k3_train_step, kernel_breakdown, run_header
from k3model.config import get_profile
from k3model.model import K3Model


def by_module(model: K3Model, ids, reps: int = 3) -> list[dict]:
    """Per module kind: ms of forward + backward (mean of `reps`) and profiler op counts."""
    from collections import defaultdict

    import torch.nn.functional as F

    caught, hooks = {}, []
    named = {}
    for i, layer in enumerate(model.layers):
        named[f"mixer:{layer.mixer_kind}:{i}"] = layer.mixer
        named[f"ffn:{type(layer.ffn).__name__}:{i}"] = layer.ffn
        for part in ("mixer_res", "ffn_res", "mixer_norm", "ffn_norm"):
            named[f"{'AttnRes' if part.endswith('res') else 'RMSNorm'}:{i}:{part}"] = getattr(layer, part)
    named["AttnRes:final"] = model.final_res

    def catch(name):
        def hook(module, args):
            caught.setdefault(name, [a.detach().clone() if torch.is_tensor(a) else [x.detach().clone() for x in a]
                                     for a in args if a is not None])
        return hook

    hooks = [m.register_forward_pre_hook(catch(n)) for n, m in named.items()]
    model.compute_loss(ids)
    for h in hooks:
        h.remove()

    def runner(module, args):
        def run():
            leaves = [a.requires_grad_() if torch.is_tensor(a) else [x.requires_grad_() for x in a] for a in args]
            out = module(*leaves)
            out = out[0] if isinstance(out, tuple) else out
            out.backward(torch.ones_like(out))
        return run

    hidden = torch.randn(*ids.shape, model.cfg.d_model, device=ids.device, requires_grad=True)

    def head():
        logits = model.lm_head(model.final_norm(hidden)).float()
        F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    jobs = [(n.split(":")[0] + ":" + n.split(":")[1] if n.startswith(("mixer", "ffn")) else n.split(":")[0],
             runner(m, caught[n])) for n, m in named.items()]
    jobs += [("lm_head+loss", head), ("AdamW", opt.step)]
    totals = defaultdict(lambda: {"ms": 0.0, "ops": 0, "calls": 0})
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    for group, fn in jobs:
        fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        totals[group]["ms"] += (time.perf_counter() - t0) / reps * 1e3
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        totals[group]["ops"] += sum(e.count for e in prof.key_averages())
        totals[group]["calls"] += 1
    return sorted(({"module": k, **v} for k, v in totals.items()), key=lambda r: -r["ms"])


KINDS_ATTRIBUTED = ("AttnRes", "RMSNorm", "KDALayer", "GatedMLA", "LatentMoE", "DenseFFN")


def label_module_calls() -> None:
    """Wrap each module kind's eager call in a profiler range `k3::<kind>` (not inside compiled code,
    where the call is traced), for `attribute`."""
    import torch.nn as nn
    from torch.profiler import record_function

    import k3model.model as model_module

    for cls in {getattr(model_module, name, None) for name in KINDS_ATTRIBUTED} - {None}:
        def call(self, *args, _kind=cls.__name__, **kwargs):
            if torch.compiler.is_compiling():
                return nn.Module.__call__(self, *args, **kwargs)
            with record_function(f"k3::{_kind}"):
                return nn.Module.__call__(self, *args, **kwargs)
        cls.__call__ = call


def attribute(trace_path: str) -> dict:
    """Device ms per (module kind, forward / backward) from a chrome trace of a step whose module
    calls carry `k3::<kind>` ranges. A kernel belongs to the CPU op that launched it (correlation id);
    a forward kernel to the outermost k3 range around that launch; a backward kernel to the autograd
    node that launched it, and through the node's sequence number to the forward op that made it,
    and so to that op's range. Kernels of neither (the optimizer, gradient accumulation, the loss)
    count as "other"."""
    import bisect
    from collections import defaultdict

    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ranges, nodes, forward_ops = defaultdict(list), defaultdict(list), []
    launches, kernels = {}, []
    for e in events:
        cat, args = e.get("cat", ""), e.get("args", {})
        if e["name"].startswith("k3::") and cat == "user_annotation":
            ranges[e["tid"]].append(e)
        elif cat == "cpu_op" and "Sequence number" in args:
            backward = "Backward" in e["name"] or "evaluate_function" in e["name"]
            (nodes[e["tid"]] if backward else forward_ops).append(e)
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:  # Triton launches: driver API
            launches[args["correlation"]] = e
        elif cat == "kernel":
            kernels.append(e)

    for table in (ranges, nodes):
        for spans in table.values():
            spans.sort(key=lambda e: (e["ts"], -e["dur"]))
    starts = {id(spans): [e["ts"] for e in spans] for table in (ranges, nodes) for spans in table.values()}

    def around(table, tid, ts):
        """The events of table[tid] whose span holds ts, outermost first."""
        spans = table.get(tid, [])
        i = bisect.bisect_right(starts[id(spans)], ts) if spans else 0
        return [e for e in spans[max(0, i - 2000):i] if e["ts"] <= ts <= e["ts"] + e["dur"]]

    seq_kind = {}
    for e in forward_ops:
        outer = around(ranges, e["tid"], e["ts"])
        if outer:
            seq_kind.setdefault(e["args"]["Sequence number"], outer[0]["name"][4:])
    table = defaultdict(float)
    for k in kernels:
        launch, label = launches.get(k["args"].get("correlation")), "other"
        if launch is not None:
            outer = around(ranges, launch["tid"], launch["ts"])
            node = around(nodes, launch["tid"], launch["ts"])
            if outer:
                label = f"{outer[0]['name'][4:]} forward"
            elif node and node[-1]["args"]["Sequence number"] in seq_kind:
                label = f"{seq_kind[node[-1]['args']['Sequence number']]} backward"
        table[label] += k["dur"] / 1e3
    return dict(sorted(table.items(), key=lambda kv: -kv[1]))


GAP_BUCKETS_US = (5, 20, 100, 1000)


def device_idle(events: list[dict], top: int = 12) -> dict:
    """Where the device had nothing to run, from a chrome trace's complete ("X") events: the span from
    the first device activity (kernel, memcpy, memset) to the last, the time none ran, the idle gaps by
    size, and the largest gaps with the kernels around them and whether the host launched the next one
    late (its launch call began after the device had gone idle: the host set the pace there) or in time
    (the gap is the device's own launch latency between dependent kernels)."""
    work = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    if not work:
        return {}
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    buckets = {f"<{b}us": [0, 0.0] for b in GAP_BUCKETS_US}
    buckets[f">={GAP_BUCKETS_US[-1]}us"] = [0, 0.0]
    gaps, busy_end, late_us = [], work[0]["ts"], 0.0
    for e in work:
        gap = e["ts"] - busy_end
        if gap > 0:
            launch = launches.get(e.get("args", {}).get("correlation"))
            late = launch is not None and launch["ts"] > busy_end
            late_us += gap if late else 0.0
            key = next((f"<{b}us" for b in GAP_BUCKETS_US if gap < b), f">={GAP_BUCKETS_US[-1]}us")
            buckets[key][0] += 1
            buckets[key][1] += gap / 1e3
            gaps.append((gap, late, e["name"][:80], busy_end))
        busy_end = max(busy_end, e["ts"] + e["dur"])
    span_us = busy_end - work[0]["ts"]
    idle_us = sum(g[0] for g in gaps)
    largest = sorted(gaps, reverse=True)[:top]
    return {
        "span_ms": span_us / 1e3, "busy_ms": (span_us - idle_us) / 1e3, "idle_ms": idle_us / 1e3,
        "idle_host_late_ms": late_us / 1e3, "gaps": len(gaps),
        "gaps_by_size": {k: {"count": n, "ms": round(ms, 3)} for k, (n, ms) in buckets.items()},
        "largest_gaps": [{"us": round(g, 1), "host_late": late, "next_kernel": name,
                          "at_ms": round((at - work[0]["ts"]) / 1e3, 3)} for g, late, name, at in largest],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="small")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", required=True)
    ap.add_argument("--by-module", action="store_true", help="also time each module kind in isolation")
    ap.add_argument("--compile-regions", action="store_true", help="k3model.compiled.compile_regions first")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode of the compiled regions, e.g. reduce-overhead (CUDA graphs)")
    ap.add_argument("--trace", default=None, help="also write a chrome trace of the profiled step here")
    ap.add_argument("--checkpointing", choices=("profile", "on", "off"), default="profile",
                    help="activation checkpointing of every layer: the profile's setting, or on / off")
    ap.add_argument("--micro-batches", type=int, default=1, help="the step's rows in this many backward passes")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="the whole step captured in one CUDA graph and replayed (k3model.train.common.CapturedStep)")
    ap.add_argument("--attribute", action="store_true",
                    help="also the device time per module kind, forward and backward (a chrome trace, parsed)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = replace(get_profile(args.profile).model, vision=None, mtp_depth=0)
    if args.checkpointing != "profile":
        cfg = replace(cfg, activation_checkpointing=args.checkpointing == "on")
    torch.manual_seed(0)
    if args.attribute:
        label_module_calls()
    model = K3Model(cfg).to(device)
    if args.compile_regions:
        from k3model.compiled import compile_regions

        compile_regions(model, dynamic=True, **({"mode": args.compile_mode} if args.compile_mode else {}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda", capturable=args.cuda_graph)
    ids = torch.randint(0, cfg.vocab_size, (max(args.tokens // args.seq_len, 1), args.seq_len), device=device)

    def eager_step(batch):
        k3_train_step(model, opt, batch, lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"),
                      args.micro_batches)

    if args.cuda_graph:  # module ranges (--attribute) exist only while capturing: its kernels read "other"
        from k3model.train.common import CapturedStep

        captured = CapturedStep(eager_step, ids, optimizer=opt)
        step = lambda: captured(ids)  # noqa: E731
    else:
        step = lambda: eager_step(ids)  # noqa: E731

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
    trace = args.trace or (args.out + ".trace.json" if args.attribute else None)
    if trace:
        prof.export_chrome_trace(trace)
    dev_attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"

    def rows(attr):
        ranked = sorted(events, key=lambda e: getattr(e, attr), reverse=True)[:args.top]
        return [{"op": e.key, "calls": e.count, "self_ms": getattr(e, attr) / 1e3} for e in ranked]

    res = {
        "header": run_header(), "profile": args.profile, "seq_len": args.seq_len, "tokens": args.tokens, "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "step_wall_s": wall,
        "device_ms_total": sum(getattr(e, dev_attr) for e in events) / 1e3,
        "host_ms_total_self": sum(e.self_cpu_time_total for e in events) / 1e3,
        "kernel_launches": sum(e.count for e in events if getattr(e, dev_attr) > 0 and e.device_type.name == "CUDA"),
        "top_by_device_time": rows(dev_attr),
        "top_by_host_time": rows("self_cpu_time_total"),
        "compiled_regions": args.compile_regions, "compile_mode": args.compile_mode, "cuda_graph": args.cuda_graph,
        "activation_checkpointing": cfg.activation_checkpointing, "micro_batches": args.micro_batches,
    }
    if device == "cuda":
        res.update(kernel_breakdown(events))
    if args.attribute:
        res["device_ms_by_module"] = attribute(trace)
        with open(trace) as f:
            res["device_idle"] = device_idle([e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"])
        if not args.trace:
            os.remove(trace)
    if args.by_module:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            res["by_module"] = by_module(model, ids[:max(len(ids) // args.micro_batches, 1)])
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"step {wall:.2f} s; device {res['device_ms_total']:.0f} ms; host {res['host_ms_total_self']:.0f} ms")
    for r in res["top_by_device_time"][:20]:
        print(f"  {r['self_ms']:9.1f} ms {r['calls']:6d}x  {r['op'][:90]}")
    for kind, r in res.get("kernels_by_kind", {}).items():
        print(f"  {kind:28s} {r['ms']:8.1f} ms {r['launches']:6d} launches")
    if "host_synchronisations" in res:
        print("  host syncs:", res["host_synchronisations"], "launch host ms:", round(res["launch_calls_host_ms"], 1))
    idle = res.get("device_idle")
    if idle:
        print(f"device idle {idle['idle_ms']:.1f} ms of a {idle['span_ms']:.1f} ms span ({idle['gaps']} gaps; "
              f"{idle['idle_host_late_ms']:.1f} ms where the host launched late):", idle["gaps_by_size"])
    print("host:")
    for r in res["top_by_host_time"][:12]:
        print(f"  {r['self_ms']:9.1f} ms {r['calls']:6d}x  {r['op'][:90]}")
    for label, ms in res.get("device_ms_by_module", {}).items():
        print(f"  {label:24s} {ms:8.1f} ms")
    for r in res.get("by_module", []):
        print(f"  {r['module']:18s} {r['ms']:8.1f} ms fwd+bwd  {r['ops']:6d} ops  ({r['calls']} modules)")


if __name__ == "__main__":
    main()
