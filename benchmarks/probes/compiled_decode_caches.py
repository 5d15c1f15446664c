"""One question: does the regionally compiled model (k3model/compiled.py) give the same decode logits
over a dynamic cache and over its static (CUDA-graph layout) copy, in eager calls?

    PYTHONPATH=. python3 benchmarks/probes/compiled_decode_caches.py --backend inductor [--device cuda]

Prints max |Δlogit| per step (tiny profile, batch 4, 32-token prompts). 2026-12-01, CPU: 0.0 at all 6
steps with aot_eager and with Inductor (docs/log/gpu.md).
"""

import argparse
from dataclasses import replace

import torch

from k3model.compiled import compile_regions
from k3model.config import get_profile
from k3model.engine import prefill
from k3model.model import K3Model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="inductor", help="a torch.compile backend, or 'none' for eager")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    cfg = replace(get_profile(args.profile).model, vision=None)
    torch.manual_seed(0)
    model = K3Model(cfg).to(args.device).eval()
    if args.backend != "none":
        compile_regions(model, backend=args.backend)
    prompts = [torch.randint(0, cfg.vocab_size, (32,)).tolist() for _ in range(4)]
    with torch.no_grad():
        cache, logits = prefill(model, prompts, args.steps + 2)
        static = cache.to_static(32 + args.steps + 2)
        tokens = logits.argmax(-1)
        for i in range(args.steps):
            a = model(tokens.unsqueeze(1), cache=cache).logits_BTV[:, 0]
            b = model(tokens.unsqueeze(1), cache=static).logits_BTV[:, 0]
            print(i, (a - b).abs().max().item(), flush=True)
            tokens = a.argmax(-1)


if __name__ == "__main__":
    main()
