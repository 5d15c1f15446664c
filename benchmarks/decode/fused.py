"""Fused input projections (k3model/fused.py) against the same model unfused: GEMMs and time per decode step.

    python benchmarks/decode/fused.py --device cpu --profiles tiny,small --out benchmarks/results/decode/2026-12-07_fused_cpu.json
    python benchmarks/decode/fused.py --device cuda --profiles small --batches 1,8 --out $OUT/fused_small_h200.json

One model per profile (random weights), fused and unfused in turn with fuse_projections /
unfuse_projections, the order alternating between repetitions; figures are medians over them.

- GEMMs per decode step at batch 1: torch.profiler's events of one step, by name. `gemms` counts the
  leaf ops that aten::linear / matmul / einsum dispatch to (aten::mm, addmm, bmm, baddbmm,
  _grouped_mm); the other names are listed beside them. On CUDA also the kernels launched by one
  replay of the captured step, by kind (benchmarks.common.kernel_breakdown: "gemm" is the figure).
- ms per decode step at each of --batches: on the CPU eager steps over the engine's dynamic cache
  (raw model steps: `engine.decode` would pad batch 1 to 4 rows); on CUDA the captured step
  (`engine.GraphStep`, bf16 weights, argmax fed back on the device, no host synchronisation) and
  eager steps.
- The logits of a prefill and --check-steps decode steps, fused against unfused (max |Δ| and
  whether every step's argmax agrees).

`--layers N` builds a profile with N layers (dataclasses.replace of its config), for a CPU too small
or too busy for the whole model; the JSON says which.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import kernel_breakdown, run_header
from k3model.config import get_profile
from k3model.engine import GraphStep, prefill
from k3model.fused import fuse_projections, fused_modules, unfuse_projections
from k3model.model import K3Model

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_grouped_mm")
COUNTED = GEMM_OPS + ("aten::linear", "aten::matmul", "aten::einsum")
MODES = ("unfused", "fused")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def set_mode(model, mode: str):
    return fuse_projections(model) if mode == "fused" else unfuse_projections(model)


def random_prompts(B: int, T: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(16, vocab, (T,), generator=g).tolist() for _ in range(B)]


def build(profile: str, layers: int | None, device: torch.device) -> K3Model:
    cfg = get_profile(profile).model
    if layers:
        cfg = replace(cfg, n_layers=layers)
    torch.manual_seed(0)
    model = K3Model(cfg).to(device).eval()
    if device.type == "cuda":
        # As benchmarks/decode/decode.py serves it: bf16 weights, the routing bias kept in fp32.
        model = model.to(torch.bfloat16)
        for moe in model.moe_layers():
            moe.expert_bias_E.data = moe.expert_bias_E.data.float()
    return model


def fused_bytes(model) -> int:
    return sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.split(".")[-1].startswith("fused_in"))


def op_counts(model, prompt_len: int) -> dict:
    """Events of one eager decode step at batch 1, by name (COUNTED), and the GEMM total."""
    cache, logits = prefill(model, random_prompts(1, prompt_len, model.cfg.vocab_size, seed=5), 8)
    tokens = logits.argmax(-1).unsqueeze(1)
    tokens = model(tokens, cache=cache).logits_BTV[:, 0].argmax(-1).unsqueeze(1)  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(tokens, cache=cache)
    names = collections.Counter(e.name for e in prof.events())
    return {"gemms": sum(names[n] for n in GEMM_OPS), "by_name": {n: names[n] for n in COUNTED if names[n]}}


def check_logits(model, prompt_len: int, steps: int) -> dict:
    """Fused against unfused: a prefill of 4 prompts and `steps` decode steps on the unfused argmax."""
    prompts = random_prompts(4, prompt_len, model.cfg.vocab_size, seed=7)
    runs = {}
    for mode in MODES:
        set_mode(model, mode)
        cache, logits = prefill(model, prompts, steps + 1)
        seen = [logits.float()]
        for s in range(steps):
            fed = (runs["unfused"][s] if mode == "fused" else seen[-1]).argmax(-1)
            seen.append(model(fed.unsqueeze(1), cache=cache).logits_BTV[:, 0].float())
        runs[mode] = seen
    diffs = [(a - b).abs().max().item() for a, b in zip(runs["unfused"], runs["fused"])]
    same = [bool((a.argmax(-1) == b.argmax(-1)).all()) for a, b in zip(runs["unfused"], runs["fused"])]
    return {"max_abs_logit_diff_prefill_then_steps": diffs, "same_argmax": same,
            "logit_scale": runs["unfused"][0].abs().max().item()}


def eager_ms(model, B: int, prompt_len: int, steps: int, device: torch.device) -> float:
    cache, logits = prefill(model, random_prompts(B, prompt_len, model.cfg.vocab_size), steps + 4)
    tokens = logits.argmax(-1)
    for _ in range(2):
        tokens = model(tokens.unsqueeze(1), cache=cache).logits_BTV[:, 0].argmax(-1)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        tokens = model(tokens.unsqueeze(1), cache=cache).logits_BTV[:, 0].argmax(-1)
    sync(device)
    return 1e3 * (time.perf_counter() - t) / steps


def captured_step(model, B: int, prompt_len: int, steps: int):
    cache, logits = prefill(model, random_prompts(B, prompt_len, model.cfg.vocab_size), 16)
    step = GraphStep(model, cache.to_static(prompt_len + steps + 16))
    return step, logits.argmax(-1)


def captured_ms(model, B: int, prompt_len: int, steps: int) -> float:
    step, tokens = captured_step(model, B, prompt_len, steps)
    for _ in range(3):
        tokens = step(tokens).argmax(-1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        tokens = step(tokens).argmax(-1)
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t) / steps


def captured_kernels(model, prompt_len: int) -> dict:
    """Kernels of one replay of the captured step at batch 1, by kind."""
    step, tokens = captured_step(model, 1, prompt_len, 8)
    for _ in range(2):
        tokens = step(tokens).argmax(-1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(tokens)
        torch.cuda.synchronize()
    return kernel_breakdown(prof.key_averages())


def timings(args, model, device: torch.device) -> list[dict]:
    rows = []
    for B in args.batches:
        times = {f"{kind}_{mode}": [] for kind in (("eager", "captured") if device.type == "cuda" else ("eager",))
                 for mode in MODES}
        for rep in range(args.reps):
            for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
                set_mode(model, mode)
                times[f"eager_{mode}"].append(eager_ms(model, B, args.prompt, args.steps, device))
                if device.type == "cuda":
                    times[f"captured_{mode}"].append(captured_ms(model, B, args.prompt, args.steps))
                    torch.cuda.empty_cache()
        row = {"batch": B, **{f"{k}_ms_per_step": statistics.median(v) for k, v in times.items()}}
        for kind in ("eager", "captured"):
            if f"{kind}_fused" in times:
                row[f"{kind}_speedup"] = row[f"{kind}_unfused_ms_per_step"] / row[f"{kind}_fused_ms_per_step"]
        row["all_ms"] = times
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "all_ms"}), flush=True)
    return rows


def bench_profile(args, name: str, device: torch.device) -> dict:
    layers = args.layers if args.layers and name != "tiny" else None
    t = time.perf_counter()
    model = build(name, layers, device)
    cfg = model.cfg
    out = {"profile": name, "n_layers": cfg.n_layers, "full_n_layers": get_profile(name).model.n_layers,
           "params": sum(p.numel() for p in model.parameters()), "dtype": str(next(model.parameters()).dtype),
           "build_s": time.perf_counter() - t, "mla_q_rank": cfg.mla_q_rank,
           "layers": {"kda": cfg.n_kda_layers, "mla": cfg.n_mla_layers, "dense_ffn": cfg.n_dense_layers,
                      "moe": cfg.n_layers - cfg.n_dense_layers}}
    with torch.no_grad():
        out["logits_check"] = check_logits(model, args.prompt, args.check_steps)
        print(name, json.dumps(out["logits_check"]), flush=True)
        counts = {}
        for mode in MODES:
            set_mode(model, mode)
            counts[mode] = op_counts(model, args.prompt)
            if mode == "fused":
                out["fused_modules"] = len(fused_modules(model))
                out["fused_copy_bytes"] = fused_bytes(model)
            if device.type == "cuda":
                counts[mode]["captured_step_kernels"] = captured_kernels(model, args.prompt)
                torch.cuda.empty_cache()
        out["ops_per_decode_step_batch1"] = counts
        print(name, json.dumps({m: (c["gemms"], c["by_name"]) for m, c in counts.items()}), flush=True)
        out["decode"] = timings(args, model, device)
    return out


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profiles", default="tiny,small", type=lambda s: s.split(","))
    ap.add_argument("--layers", type=int, default=0, help="build the profiles other than tiny with this many "
                    "layers (0: the profile's own)")
    ap.add_argument("--batches", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps per repetition")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--check-steps", type=int, default=4)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device(args.device)
    out = {"benchmark": "decode/fused", "args": vars(args), "header": run_header(), "threads": torch.get_num_threads(),
           "profiles": []}
    for name in args.profiles:
        # The JSON is rewritten after each profile, so a late failure keeps the figures measured.
        try:
            out["profiles"].append(bench_profile(args, name, device))
        except Exception as err:  # noqa: BLE001 - record it and go on to the next profile
            import traceback
            traceback.print_exc()
            out["profiles"].append({"profile": name, "error": f"{type(err).__name__}: {err}"})
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print("wrote", args.out)


if __name__ == "__main__":
    main()
