"""Where a speculative verify (K + 1 tokens in one forward over a static cache) parts from K + 1
one-token decode steps, module by module, on CUDA: the first module whose output at some position
is not bitwise the step's, and whether the MoE routing (the experts chosen) agrees.

    PYTHONPATH=$PWD python3 benchmarks/probes/verify_rows.py --profile small --out OUT.json

Random weights, bf16, eager modules. `--pad-router R`: the router's fp32 GEMM over at least R rows
(zero rows appended), the candidate fix: fp32 GEMMs pick kernels by row count on the H200
(benchmarks/probes/row_bits.py). With --parity N, also greedy speculative decoding against plain
decoding on N prompts of benchmarks/speculative.py's cases.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from benchmarks.common import run_header
from k3model.cache import ModelCache
from k3model.config import get_profile
from k3model.model import K3Model
from k3model.moe import LatentMoE


def record(model):
    """Forward hooks on every layer's parts; returns (outputs by name in call order, routes, handles)."""
    seen: dict[str, list[torch.Tensor]] = {}
    handles = []
    for i, layer in enumerate(model.layers):
        for part in ("mixer_res", "mixer_norm", "mixer", "ffn_res", "ffn_norm", "ffn"):
            def hook(module, args, out, name=f"{i}.{part}"):
                seen.setdefault(name, []).append((out[0] if isinstance(out, tuple) else out).detach().clone())
            handles.append(getattr(layer, part).register_forward_hook(hook))
        if layer.mixer_kind == "kda":
            # Inside the KDA layer: each projection's and conv's first output of a forward, and the
            # recurrence's output (o_norm's input).
            for sub, module in layer.mixer.named_children():
                def sub_hook(module, args, out, name=f"{i}.mixer.{sub}"):
                    seen.setdefault(name, []).append((out[0] if isinstance(out, tuple) else out).detach().clone())
                handles.append(module.register_forward_hook(sub_hook))

            def o_hook(module, args, name=f"{i}.mixer.o_norm.input"):
                seen.setdefault(name, []).append(args[0].detach().clone())
            handles.append(layer.mixer.o_norm.register_forward_pre_hook(o_hook))
    return seen, handles


def compare(model, prompt_1P, fed_1T):
    cache = model(prompt_1P, use_cache=True).cache
    T = fed_1T.shape[1]
    capacity = prompt_1P.shape[1] + T + 8
    steps, verify = cache.to_static(capacity), cache.to_static(capacity, max_tokens=T)
    routes: list = []
    original = LatentMoE.route

    def route(self, x_MD):
        out = original(self, x_MD)
        routes.append(out[0].clone())
        return out

    LatentMoE.route = route
    try:
        seen, handles = record(model)
        for t in range(T):
            model(fed_1T[:, t: t + 1], cache=steps)
        # A verify calls the KDA projections twice (the second for the conv windows): the first counts.
        step_out = {k: torch.cat(v[:T] if len(v) >= T else v, dim=1) for k, v in seen.items()}
        step_routes = routes[:]
        seen.clear(), routes.clear()
        model(fed_1T, cache=verify)
        verify_out = {k: v[0] for k, v in seen.items()}
        for h in handles:
            h.remove()
    finally:
        LatentMoE.route = original
    rows, first = [], None
    for name in step_out:
        diff_T = (step_out[name].float() - verify_out[name].float()).abs().flatten(2).amax(-1)[0]
        rows.append({"module": name, "max_abs_diff_by_position": diff_T.tolist()})
        if first is None and diff_T.max() > 0:
            first = name
    # Steps: one route call per MoE layer per step (T × n), verify: one per layer with T rows.
    per_layer = len(routes)
    flips = 0
    for j in range(per_layer):
        for t in range(T):
            flips += not torch.equal(step_routes[t * per_layer + j][0].sort().values, routes[j][t].sort().values)
    return {"first_differing_module": first, "routing_flips": flips, "moe_layers": per_layer,
            "modules": rows}


def pad_router(rows: int) -> None:
    """LatentMoE.route over at least `rows` rows (inference on CUDA), the rest zeros."""
    original = LatentMoE.route

    def route(self, x_MD):
        M = x_MD.shape[0]
        if not x_MD.is_cuda or torch.is_grad_enabled() or M >= rows:
            return original(self, x_MD)
        padded = torch.cat([x_MD, x_MD.new_zeros(rows - M, x_MD.shape[1])])
        ids, p, cutoff, s = original(self, padded)
        return ids[:M], p[:M], None if cutoff is None else cutoff[:M], s[:M]

    LatentMoE.route = route


def parity(profile: str, prompts: int, scale: float) -> dict:
    sys.argv = sys.argv[:1]
    from benchmarks.speculative import targets
    from k3model.engine import SamplingConfig, generate
    from k3model.speculative import speculative_generate

    out = {}
    g = torch.Generator().manual_seed(0)
    for name, (target, draft) in targets(profile, 0, scale).items():
        target, draft = target.cuda().to(torch.bfloat16), draft.cuda().to(torch.bfloat16)
        cfg = SamplingConfig(max_new_tokens=24)
        same, taus = 0, []
        for _ in range(prompts):
            p = torch.randint(0, target.cfg.vocab_size, (32,), generator=g).tolist()
            plain = generate(target, [p], cfg)[0].token_ids
            spec, stats = speculative_generate(target, draft, p, cfg, 4)
            same += spec == plain
            taus.append(stats.acceptance_length)
        out[name] = {"parity": f"{same}/{prompts}", "tau": sum(taus) / len(taus)}
        del target, draft
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="small")
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--pad-router", type=int, default=0, help="(the library pads to moe.ROUTER_MIN_ROWS itself now)")
    ap.add_argument("--parity", type=int, default=0)
    ap.add_argument("--predictable-scale", type=float, default=12.0)
    ap.add_argument("--device", default="cuda", help="cpu runs the same comparison (a check of the probe itself)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.pad_router:
        pad_router(args.pad_router)
    torch.manual_seed(0)
    model = K3Model(get_profile(args.profile).model).to(args.device, torch.bfloat16).eval()
    V = model.cfg.vocab_size
    result = {"probe": "verify_rows", **run_header(), "args": vars(args), "cases": []}
    with torch.no_grad():
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            prompt = torch.randint(0, V, (1, 32), generator=g).to(args.device)
            fed = torch.randint(0, V, (1, args.tokens), generator=g).to(args.device)
            case = compare(model, prompt, fed)
            print(seed, "first differing:", case["first_differing_module"], "routing flips:", case["routing_flips"],
                  flush=True)
            result["cases"].append(case)
        del model
        if args.parity:
            result["parity"] = parity(args.profile, args.parity, args.predictable_scale)
            print(result["parity"], flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
