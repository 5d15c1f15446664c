"""The inference card of `k3 serve` (issue 44 item 4): tokens/s and latency per request over a batch
sweep, with and without the draft, fp32 vs MXFP4, and the decode step's memory-bandwidth utilisation.

    nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/decode/serve.py --profile tiny \
        --out benchmarks/results/decode/2026-12-05_serve_tiny_cpu.json

A random-init model of the profile (its figures are speed, not quality) is saved as the checkpoints
the server loads: fp32; MXFP4 routed experts with the rest fp32; and an untrained draft from the
model's MTP module (k3model.draft.draft_from_mtp). The MXFP4 export with the rest bf16 (the form
quantized_student writes) is saved for its file size only: the CPU loaders build an fp32 model and
load its bf16 tensors into it, so on the CPU it serves exactly as the fp32-rest export does. Each is served by k3model.server on 127.0.0.1 from this
process, and for each batch size B, B clients send one greedy request each at once (distinct
random prompts of --prompt tokens, --new tokens each): per-request latency (median, max) and the
aggregate tokens/s = B · new / wall, each B run --reps times and the median-wall run kept. The draft runs batch 1 only (speculative decoding is one
prompt at a time), beside the same request without it; its acceptance length τ comes from
`speculative_generate`'s stats on the same prompt.

Bandwidth utilisation of the decode step (measured outside HTTP, the engine's step at B rows, padded
to MIN_ROWS as the server does):

    util = bytes the step must read / step time / copy bandwidth

bytes = every non-expert weight but the embedding table and the MTP / vision modules, + the routed
experts B tokens can touch (min(E, B·k) per MoE layer; MXFP4: codes + E8M0 scales), + B embedding
rows, + the KDA states (fp32 recurrent matrix read and written, conv windows) and the MLA latents at
the mid-generation length. copy bandwidth = 2 · bytes / time of the best of 10 copies of a 64 MiB
fp32 tensor (read + write), measured in the same run. On the CPU the float MoE runs every routed
expert for small batches (k3model/moe.py `_dense_experts`, for batch invariance), so it reads more
than this floor. One intra-op thread (the server's batch invariance needs it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.common import close_report, run_header, write_json
from k3model.fused import BIAS as FUSED_BIAS, WEIGHT as FUSED_WEIGHT


def copy_bandwidth(mib: int = 64) -> float:
    x = torch.randn(mib << 18)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        y.copy_(x)
        best = min(best, time.perf_counter() - t0)
    return 2 * x.numel() * 4 / best


def step_bytes(model, B: int, length: int) -> dict:
    cfg = model.cfg
    experts, other = 0, 0
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        # A fused projection (k3model/fused.py) reads its copy instead of its members: count them once.
        if name.startswith(("mtp", "vision", "embed")) or name.rsplit(".", 1)[-1] in (FUSED_WEIGHT, FUSED_BIAS):
            continue
        if any(w in name for w in ("w_gate_EHL", "w_up_EHL", "w_down_ELH")):
            E = t.shape[0]
            experts += t.numel() // E * min(E, B * cfg.top_k) * t.element_size()
        else:
            other += t.numel() * t.element_size()
    other += B * cfg.d_model * model.embed.weight.element_size()
    kda = cfg.n_kda_layers * B * (cfg.kda_heads * cfg.kda_head_dim ** 2 * 4 * 2
                                  + 3 * cfg.kda_heads * cfg.kda_head_dim * 3 * 4 * 2)
    mla = cfg.n_mla_layers * B * length * (cfg.mla_kv_rank + cfg.mla_qk_rope_dim) * 4
    return {"weights": other + experts, "routed_experts": experts, "kda_state": kda, "mla_latent": mla,
            "total": other + experts + kda + mla}


@torch.no_grad()
def step_time(model, B: int, prompt: int, steps: int) -> float:
    """Seconds per decode step at B rows (padded to MIN_ROWS), after a prefill of `prompt` tokens."""
    from k3model.engine import MIN_ROWS, prefill
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(40, model.cfg.vocab_size, (prompt,), generator=g).tolist() for _ in range(B)]
    cache, logits_BV = prefill(model, prompts, steps + 1)
    rows = max(B, MIN_ROWS)
    if rows > B:
        cache = cache.select(list(range(B)) + [0] * (rows - B))
        logits_BV = torch.cat([logits_BV, logits_BV[[0] * (rows - B)]])
    tokens = logits_BV.argmax(-1)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        tokens = model(tokens.unsqueeze(1), cache=cache).logits_BTV[:, 0].argmax(-1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--step-reps", type=int, default=12)
    ap.add_argument("--reps", type=int, default=3, help="runs of each batch size through the server (median kept)")
    ap.add_argument("--draft-len", type=int, default=4)
    ap.add_argument("--out", default=f"benchmarks/results/decode/{time.strftime('%Y-%m-%d')}_serve_tiny_cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    report = {"benchmark": "serve", "header": run_header(), "args": vars(args), "note": __doc__.split("\n\n", 2)[2]}
    error = None
    try:
        from k3model.checkpoint import save_checkpoint
        from k3model.config import get_profile
        from k3model.draft import draft_from_mtp, draft_manifest
        from k3model.engine import SamplingConfig
        from k3model.model import K3Model
        from k3model.quantize import export_quantized
        from k3model.speculative import speculative_generate
        from k3model.server import card, load_served

        batches = [int(b) for b in args.batches.split(",")]
        report["copy_bandwidth_GBps"] = round(copy_bandwidth() / 1e9, 2)
        print(f"copy bandwidth {report['copy_bandwidth_GBps']} GB/s", flush=True)
        torch.manual_seed(0)
        model = K3Model(get_profile(args.profile).model).eval()
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            save_checkpoint(root / "fp32", model.state_dict(), {"config": {"model": asdict(model.cfg)}})
            export_quantized(model, root / "mxfp4")
            export_quantized(model, root / "mxfp4_bf16", other_dtype=torch.bfloat16)
            draft = draft_from_mtp(model)
            save_checkpoint(root / "draft", draft.state_dict(), draft_manifest(draft))
            report["file_bytes"] = {n: (root / n / "model.safetensors").stat().st_size
                                    for n in ("fp32", "mxfp4", "mxfp4_bf16", "draft")}
            variants = {}
            length = args.prompt + args.new // 2
            for name in ("fp32", "mxfp4"):
                served = load_served(root / name, model_id=f"bench-{name}")
                steps = {}
                for B in batches:
                    t = step_time(served.model, B, args.prompt, args.step_reps)
                    nbytes = step_bytes(served.model, B, length)
                    steps[str(B)] = {"step_ms": round(t * 1e3, 3), "bytes": nbytes,
                                     "bandwidth_util": round(nbytes["total"] / t / (report["copy_bandwidth_GBps"] * 1e9), 4)}
                    print(name, B, json.dumps(steps[str(B)]), flush=True)
                variants[name] = {"quantization": served.quantization, "decode_step": steps,
                                  "serve": card(served, batches, args.prompt, args.new, log=print, reps=args.reps)}
            # With the draft: batch 1, against the same request without it (the fp32 target).
            served = load_served(root / "fp32", draft_path=root / "draft", model_id="bench-fp32-draft")
            spec = card(served, [1], args.prompt, args.new, log=print, reps=args.reps)
            g = torch.Generator().manual_seed(0)
            prompt = torch.randint(40, model.cfg.vocab_size, (args.prompt,), generator=g).tolist()
            _, stats = speculative_generate(served.model, served.draft, prompt, SamplingConfig(args.new), args.draft_len)
            variants["fp32+draft"] = {"serve": spec, "draft_len": args.draft_len,
                                      "acceptance_length": stats.acceptance_length,
                                      "draft": "untrained (the random model's MTP module): τ near 1 shows the overhead"}
        report["variants"] = variants
    except Exception:  # noqa: BLE001 - record how the run ended
        error = traceback.format_exc()
    return close_report(report, t_start, lambda: write_json(args.out, report), error)


if __name__ == "__main__":
    sys.exit(main())
