"""One question: with compiled regions (k3model/compiled.py), does the CUDA-graph decode step
(`engine.GraphStep`) equal the same compiled model called eagerly over a static cache of the same
layout, step by step, and if not, which cache tensor is the first to differ?

    PYTHONPATH=. python3 benchmarks/probes/compiled_capture.py --profile small [--no-compile] [--out F.json]

Three runs of the same decode from one prefill (batch 4, 64-token prompts, greedy tokens of run A fed
to all): A compiled eager calls over a static cache, B the captured compiled step over another copy,
C compiled eager calls over the dynamic cache, A2 a repeat of A over a third copy (is the
eager step itself deterministic?). Prints, per step, max |Δlogit| of B and C against A and the first cache tensor where B's
state differs from A's. Needs CUDA (bf16 weights).
"""

import argparse
import json
from dataclasses import replace

import torch

from k3model.compiled import compile_regions
from k3model.config import get_profile
from k3model.engine import GraphStep, prefill
from k3model.model import K3Model


def tensor_names(cache) -> list[str]:
    names = []
    for i, layer in enumerate(cache.layers):
        if hasattr(layer, "recurrent"):
            names += [f"layer{i}.conv_q", f"layer{i}.conv_k", f"layer{i}.conv_v", f"layer{i}.recurrent"]
        else:
            names.append(f"layer{i}.latents")
    return names + ["lengths"]


def first_difference(a, b) -> tuple[str | None, float]:
    worst = 0.0
    first = None
    for name, x, y in zip(tensor_names(a), a.tensors(), b.tensors()):
        d = (x.float() - y.float()).abs().max().item()
        if d > 0 and first is None:
            first = name
        worst = max(worst, d)
    return first, worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="small")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = replace(get_profile(args.profile).model, vision=None)
    torch.manual_seed(0)
    model = K3Model(cfg).to("cuda", torch.bfloat16).eval()
    if not args.no_compile:
        compile_regions(model)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, cfg.vocab_size, (64,), generator=g).tolist() for _ in range(4)]
    rows = []
    with torch.no_grad():
        dynamic, logits = prefill(model, prompts, args.steps + 2)
        capacity = 64 + args.steps + 2
        static_a, static_b, static_a2 = (dynamic.to_static(capacity) for _ in range(3))
        step = GraphStep(model, static_b)
        tokens = logits.argmax(-1)
        for i in range(args.steps):
            a = model(tokens.unsqueeze(1), cache=static_a).logits_BTV[:, 0].float()
            b = step(tokens).float()
            c = model(tokens.unsqueeze(1), cache=dynamic).logits_BTV[:, 0].float()
            a2 = model(tokens.unsqueeze(1), cache=static_a2).logits_BTV[:, 0].float()
            first, worst = first_difference(static_a, static_b)
            row = {"step": i + 1, "graph_vs_eager_static": (a - b).abs().max().item(),
                   "dynamic_vs_eager_static": (a - c).abs().max().item(),
                   "eager_static_twice": (a - a2).abs().max().item(),
                   "first_state_tensor_differing": first, "max_state_diff": worst,
                   "same_argmax_graph": bool((a.argmax(-1) == b.argmax(-1)).all())}
            print(json.dumps(row), flush=True)
            rows.append(row)
            tokens = a.argmax(-1)
    counters = {}
    try:
        from torch._dynamo.utils import counters as dynamo_counters

        counters = {k: dict(v) for k, v in dynamo_counters.items() if k in ("stats", "recompiles")}
    except ImportError:
        pass
    out = {"profile": args.profile, "compiled": not args.no_compile, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(), "rows": rows, "dynamo_counters": counters}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
