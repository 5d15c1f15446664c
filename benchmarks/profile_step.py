"""Where a training step's time goes: torch.profiler over one K3 forward+backward+AdamW step.

    PYTHONPATH=. python3 benchmarks/profile_step.py --profile small --seq-len 512 --tokens 65536 --out prof.json

Writes the top operators by device time and by host time (self time, so nothing is counted twice),
the step's wall time, and how many kernels it launched. Random tokens, as benchmarks/train_step.py.

`--by-module` adds time and operator counts per module kind (KDA, MLA, LatentMoE, dense FFN,
AttnRes, RMSNorm, the LM head with its loss, AdamW): each module's inputs are caught during one
real forward, then its forward + backward is profiled on them in isolation, so backward work is
attributed too (the autograd engine's own ops carry no module). On the CPU this is the table that
decided issue 17's changes (docs/log/tiny.md).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import kernel_breakdown
from benchmarks.train_step import k3_train_step
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

    hidden = torch.randn(*ids.shape, model.cfg.d_model, requires_grad=True)

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
    for group, fn in jobs:
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        totals[group]["ms"] += (time.perf_counter() - t0) / reps * 1e3
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        totals[group]["ops"] += sum(e.count for e in prof.key_averages())
        totals[group]["calls"] += 1
    return sorted(({"module": k, **v} for k, v in totals.items()), key=lambda r: -r["ms"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="small")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", required=True)
    ap.add_argument("--by-module", action="store_true", help="also time each module kind in isolation")
    ap.add_argument("--compile-regions", action="store_true", help="k3model.compiled.compile_regions first")
    ap.add_argument("--trace", default=None, help="also write a chrome trace of the profiled step here")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = replace(get_profile(args.profile).model, vision=None, mtp_depth=0)
    torch.manual_seed(0)
    model = K3Model(cfg).to(device)
    if args.compile_regions:
        from k3model.compiled import compile_regions

        compile_regions(model, dynamic=True)
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
    if args.trace:
        prof.export_chrome_trace(args.trace)
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
        "compiled_regions": args.compile_regions,
    }
    if device == "cuda":
        res.update(kernel_breakdown(events))
    if args.by_module:
        res["by_module"] = by_module(model, ids)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"step {wall:.2f} s; device {res['device_ms_total']:.0f} ms; host {res['host_ms_total_self']:.0f} ms")
    for r in res["top_by_device_time"][:20]:
        print(f"  {r['self_ms']:9.1f} ms {r['calls']:6d}x  {r['op'][:90]}")
    for kind, r in res.get("kernels_by_kind", {}).items():
        print(f"  {kind:28s} {r['ms']:8.1f} ms {r['launches']:6d} launches")
    if "host_synchronisations" in res:
        print("  host syncs:", res["host_synchronisations"], "launch host ms:", round(res["launch_calls_host_ms"], 1))
    print("host:")
    for r in res["top_by_host_time"][:12]:
        print(f"  {r['self_ms']:9.1f} ms {r['calls']:6d}x  {r['op'][:90]}")
    for r in res.get("by_module", []):
        print(f"  {r['module']:18s} {r['ms']:8.1f} ms fwd+bwd  {r['ops']:6d} ops  ({r['calls']} modules)")


if __name__ == "__main__":
    main()
