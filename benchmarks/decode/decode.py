"""Decode speed of the generation engine (k3model/engine.py) beside a peer measured in the same run.

    python benchmarks/decode/decode.py --device cpu --profile tiny --batches 1,64 --out benchmarks/results/decode/2026-12-01_decode_tiny_cpu.json
    python benchmarks/decode/decode.py --device cuda --profile small --batches 1,16,64 --prompt 512 --out $OUT/decode_small_h200.json

CPU: `engine.generate` (greedy, 128-token prompts, 128 new tokens) against a dense Llama-style
model of the same active parameter count through Hugging Face `transformers` `generate` with its
static cache, same prompt and output lengths, repetitions interleaved (the 2-core machine is shared:
the ratio is the figure, the absolute times move with the load). Plus the rollout throughput of
`k3model.train.rollout.TokenPolicy` on a batch of general-agents episodes.

CUDA (bf16 weights): `generate` end to end, and the CUDA-graph decode step (`engine.GraphStep`)
replayed with on-device argmax feeding (no host synchronisation), against the bandwidth floor

    floor = (weight bytes a step reads + state bytes it reads and writes) / copy bandwidth

with the weight bytes of the non-expert parameters plus the routed experts the batch can touch
(min(E, B·k) per MoE layer), the state bytes of the KDA states (read + write, fp32), the conv
windows and the MLA latents at the mid-generation length, and the copy bandwidth of a 1 GiB
device-to-device copy measured in the same run. Also the distribution of model_logprobs − score on
sampled sequences (engine in bf16 against the training forward under bf16 autocast), and eager
decode with the routed experts in MXFP4 (`kernels.mx.mx_linear_experts`) against bf16 experts.
`--fuse-projections` measures the model as `k3 serve` loads it, its input projections fused
(k3model/fused.py; fused against unfused in one run: benchmarks/decode/fused.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import torch

from benchmarks.common import run_header
from k3model.config import get_profile
from k3model.engine import GraphStep, SamplingConfig, generate, prefill, score
from k3model.fused import fuse_projections
from k3model.model import K3Model
from k3model.params import count_params


def header(args) -> dict:
    return {"benchmark": "decode", "args": vars(args), "header": run_header(), "threads": torch.get_num_threads()}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device):
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def random_prompts(B, T, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(16, vocab, (T,), generator=g).tolist() for _ in range(B)]


# ----------------------------------------------------------------------------------------------
# The peer: a dense Llama of the same active size through transformers' generate, static cache.

def llama_peer(profile: str, active: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = get_profile(profile).model
    d, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    heads = cfg.mla_heads
    # Embedding + head + per layer 4·d² attention; the MLP width makes up the rest of `active`.
    mlp = max(32, int((active - 2 * V * d - L * 4 * d * d) / (L * 3 * d)))
    lcfg = LlamaConfig(vocab_size=V, hidden_size=d, intermediate_size=mlp, num_hidden_layers=L,
                       num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=4096,
                       tie_word_embeddings=False)
    model = LlamaForCausalLM(lcfg).eval()
    return model, sum(p.numel() for p in model.parameters()), mlp


def peer_generate(model, prompts, new):
    ids = torch.tensor(prompts)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, cache_implementation="static", pad_token_id=0)


# ----------------------------------------------------------------------------------------------

def bench_cpu(args, model, out):
    device = torch.device("cpu")
    counts = count_params(args.profile)
    peer = None
    try:
        peer, peer_params, peer_mlp = llama_peer(args.profile, counts["active"])
        out["peer"] = {"kind": "transformers LlamaForCausalLM, static cache", "params": peer_params,
                       "intermediate_size": peer_mlp, "k3_active_params": counts["active"]}
        import transformers
        out["peer"]["transformers"] = transformers.__version__
    except ImportError as err:
        out["peer"] = {"error": f"transformers not importable: {err}"}
    rows = []
    for B in args.batches:
        prompts = random_prompts(B, args.prompt, model.cfg.vocab_size)
        cfg = SamplingConfig(max_new_tokens=args.new)
        generate(model, prompts[:1], SamplingConfig(max_new_tokens=4))  # warm-up
        if peer is not None:
            peer_generate(peer, prompts[:1], 4)
        ours, ours_prefill, theirs = [], [], []
        for _ in range(args.reps):
            t, _ = timed(lambda: prefill(model.eval(), prompts, args.new), device)
            ours_prefill.append(t)
            t, outs = timed(lambda: generate(model, prompts, cfg), device)
            assert all(len(o.token_ids) == args.new for o in outs)
            ours.append(t)
            if peer is not None:
                t, ids = timed(lambda: peer_generate(peer, prompts, args.new), device)
                assert ids.shape == (B, args.prompt + args.new)
                theirs.append(t)
        row = {"batch": B, "prompt": args.prompt, "new_tokens": args.new,
               "ours_total_s": min(ours), "ours_prefill_s": min(ours_prefill),
               "ours_ms_per_step": 1e3 * min(ours) / args.new,
               "ours_decode_ms_per_step": 1e3 * (min(ours) - min(ours_prefill)) / args.new,
               "ours_tokens_per_s": B * args.new / min(ours), "ours_all_s": ours}
        if theirs:
            row.update({"peer_total_s": min(theirs), "peer_ms_per_step": 1e3 * min(theirs) / args.new,
                        "peer_tokens_per_s": B * args.new / min(theirs), "peer_all_s": theirs,
                        "speedup_vs_peer": min(theirs) / min(ours)})
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("all_s")}), flush=True)
    out["decode"] = rows
    if args.rollout_envs:
        out["rollout"] = bench_rollout(args, model)
        print(json.dumps(out["rollout"]), flush=True)


def bench_rollout(args, model):
    import envs
    from k3model.train.rollout import TokenFormat, TokenPolicy

    fmt = TokenFormat(encode=lambda text: [16 + b for b in text.encode()],
                      decode=lambda ids: bytes(i - 16 if 16 <= i < 272 else 63 for i in ids).decode(errors="replace"),
                      stop_id=2, observation_start=(1,), observation_end=(2, 3))
    names = envs.list_envs("general_agents")
    env_list = [envs.make_env(names[i % len(names)], seed=i, max_steps=args.rollout_turns)
                for i in range(args.rollout_envs)]
    policy = TokenPolicy(model, fmt, SamplingConfig(max_new_tokens=args.rollout_new, temperature=1.0),
                         generator=torch.Generator().manual_seed(0))
    t = time.perf_counter()
    episodes = policy.run(env_list, seeds=list(range(len(env_list))))
    wall = time.perf_counter() - t
    generated = sum(sum(ep.generated) for ep in episodes)
    return {"episodes": len(episodes), "turns": policy.decode_batches, "wall_s": wall,
            "episodes_per_s": len(episodes) / wall, "generated_tokens_per_s": generated / wall,
            "tokens_per_episode_mean": sum(len(ep.token_ids) for ep in episodes) / len(episodes),
            "generated_tokens": generated, "format": "bytes (16 + byte), general_agents envs, hermes harness"}


# ----------------------------------------------------------------------------------------------

def copy_bandwidth(device) -> float:
    x = torch.empty(1 << 28, dtype=torch.float32, device=device)  # 1 GiB
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    times = []
    for _ in range(10):
        t, _ = timed(lambda: y.copy_(x), device)
        times.append(t)
    return 2 * x.numel() * 4 / min(times)


def step_bytes(model, B, length) -> dict:
    cfg = model.cfg
    experts, other = 0, 0
    for name, p in model.named_parameters():
        if name.startswith(("mtp", "vision", "embed")):
            continue
        if "w_gate_EHL" in name or "w_up_EHL" in name or "w_down_ELH" in name:
            E = p.shape[0]
            experts += p.numel() // E * min(E, B * cfg.top_k) * p.element_size()
        else:
            other += p.numel() * p.element_size()
    other += B * cfg.d_model * model.embed.weight.element_size()  # the embedding rows read
    kda = cfg.n_kda_layers * B * (cfg.kda_heads * cfg.kda_head_dim ** 2 * 4 * 2
                                  + 3 * cfg.kda_heads * cfg.kda_head_dim * 3 * 2 * 2)
    mla = cfg.n_mla_layers * B * length * (cfg.mla_kv_rank + cfg.mla_qk_rope_dim) * 2
    return {"weights": other + experts, "routed_experts": experts, "kda_state": kda, "mla_latent": mla,
            "total": other + experts + kda + mla}


def diagnose(model, model_fp32, out):
    """Where decode and the training forward part: full forward vs prefill + one step, per dtype;
    grouped vs looped expert matmuls at decode sizes; chunked vs recurrent KDA final state."""
    from k3model import moe as moe_mod
    from kernels.kda import chunk_kda, naive_recurrent_kda
    res = {}
    prompts = random_prompts(4, 64, model.cfg.vocab_size, seed=3)
    ids = torch.tensor(prompts, device="cuda")
    for name, m in (("bf16", model), ("fp32", model_fp32)):
        full = m(ids).logits_BTV[:, -1].float()
        cache, _ = prefill(m, [p[:-1] for p in prompts], 4)
        stepped = m(ids[:, -1:], cache=cache).logits_BTV[:, 0].float()
        res[f"full_vs_step_{name}"] = (full - stepped).abs().max().item()
        res[f"full_logp_vs_step_{name}"] = (full.log_softmax(-1) - stepped.log_softmax(-1)).abs().max().item()
    layer = model_fp32.moe_layers()[0]
    for R in (4, 64, 4096):
        z = torch.randn(R, layer.cfg.latent_dim, device="cuda")
        ids_R = torch.randint(0, layer.cfg.n_routed, (R,), device="cuda").sort().values
        counts = moe_mod.count_per_expert(ids_R, layer.cfg.n_routed)
        glu = lambda g, u: moe_mod.situ_glu(g, u, 4.0, 25.0)  # noqa: E731
        ws = (layer.w_gate_EHL, layer.w_up_EHL, layer.w_down_ELH)
        a = moe_mod._grouped_experts(z, counts, *ws, glu, lambda x: x)
        b = moe_mod._looped_experts(z, counts, *ws, glu, lambda x: x)
        res[f"grouped_vs_looped_R{R}"] = (a.float() - b.float()).abs().max().item() / b.abs().max().item()
    B, T, H, K = 2, 200, 8, 128
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1) for _ in range(2))
    v, g, beta = torch.randn(B, T, H, K, device="cuda"), -torch.rand(B, T, H, K, device="cuda") * 0.5, torch.rand(B, T, H, device="cuda")
    o1, s1 = chunk_kda(q, k, v, g, beta, output_final_state=True, initial_state=torch.zeros(B, H, K, K, device="cuda"))
    o2, s2 = naive_recurrent_kda(q, k, v, g, beta, output_final_state=True)
    res["chunk_vs_naive_o"] = (o1.float() - o2).abs().max().item()
    res["chunk_vs_naive_state"] = (s1 - s2).abs().max().item()
    out["diagnose"] = res
    print(json.dumps(res), flush=True)


def routing_flips(model, model_fp32, out):
    """Why decode and the training forward part on the GPU: the last token's expert choice, per MoE
    layer, in the full forward vs prefill + one step; with the KDA chunk in Triton (tf32 dots) or in
    torch, and cuBLAS tf32 off. A flipped top-k choice sends a token to other experts."""
    import k3model.kda_layer as kda_mod
    from kernels.kda import chunk_kda
    torch.backends.cuda.matmul.allow_tf32 = False
    prompts = random_prompts(8, 64, model.cfg.vocab_size, seed=3)
    ids = torch.tensor(prompts, device="cuda")
    res = {}
    for name, m, backend in (("fp32_triton", model_fp32, None), ("fp32_torch", model_fp32, "torch"),
                             ("bf16_triton", model, None)):
        kda_mod.chunk_kda = lambda *a, backend=backend, **kw: chunk_kda(*a, backend=backend, **kw)
        picks = []
        for moe in m.moe_layers():
            def route(x, moe=moe, orig=type(moe).route):
                r = orig(moe, x)
                picks.append(r[0].sort(-1).values)
                return r
            moe.route = route
        full = m(ids).logits_BTV[:, -1].float()
        full_picks, picks[:] = [p.view(8, 64, -1)[:, -1] for p in picks], []
        cache, _ = prefill(m, [p[:-1] for p in prompts], 4)
        picks.clear()
        stepped = m(ids[:, -1:], cache=cache).logits_BTV[:, 0].float()
        flips = [(a != b).any(-1).float().mean().item() for a, b in zip(full_picks, picks)]
        for moe in m.moe_layers():
            del moe.route
        res[name] = {"max_abs_logit_diff": (full - stepped).abs().max().item(),
                     "tokens_with_a_flip_in_any_layer": torch.stack([(a != b).any(-1) for a, b in zip(full_picks, picks)]).any(0).float().mean().item(),
                     "flip_rate_per_layer": flips}
    kda_mod.chunk_kda = chunk_kda
    out["routing_flips"] = res
    print(json.dumps(res), flush=True)


def check_graph(model, out):
    """The captured step against eager steps from one prefill, 8 steps, batch 4: over a static copy
    of the cache (the same layout, so with compiled regions the same compiled graphs: must be
    exact) and over the dynamic cache (other strides, so compiled regions recompile and may round
    differently; exact with eager modules)."""
    prompts = random_prompts(4, 64, model.cfg.vocab_size, seed=2)
    cache, logits = prefill(model, prompts, 16)
    static = cache.to_static(64 + 16)
    step = GraphStep(model, cache.to_static(64 + 16))
    tokens, diffs, dynamic_diffs, same = logits.argmax(-1), [], [], []
    for _ in range(8):
        eager = model(tokens.unsqueeze(1), cache=static).logits_BTV[:, 0].float()
        graphed = step(tokens).float()
        dynamic = model(tokens.unsqueeze(1), cache=cache).logits_BTV[:, 0].float()
        diffs.append((eager - graphed).abs().max().item())
        dynamic_diffs.append((eager - dynamic).abs().max().item())
        same.append(bool((eager.argmax(-1) == graphed.argmax(-1)).all()))
        tokens = eager.argmax(-1)
    out["graph_check"] = {"max_abs_logit_diff_per_step": diffs, "same_argmax": same,
                          "dynamic_cache_max_abs_logit_diff_per_step": dynamic_diffs,
                          "logit_scale": eager.abs().max().item()}
    print(json.dumps(out["graph_check"]), flush=True)


def captured_ms_per_step(model, prompts, new):
    """(capture seconds, ms per replay) of the captured step over `new` − 8 replays after 3 warm ones,
    argmax fed back on the device: no host synchronisation inside the loop."""
    device = torch.device("cuda")
    cache, logits = prefill(model, prompts, new)
    static = cache.to_static(len(prompts[0]) + new + 8)
    t_capture, step = timed(lambda: GraphStep(model, static), device)
    tokens = logits.argmax(-1)
    for _ in range(3):  # warm replays (write the cache past the prompt; lengths stay in range)
        tokens = step(tokens).argmax(-1)
    n = new - 8
    t, _ = timed(lambda: replay(step, tokens, n), device)
    return t_capture, 1e3 * t / n


def bench_cuda(args, model, out):
    device = torch.device("cuda")
    bw = copy_bandwidth(device)
    out["copy_bandwidth_GBps"] = bw / 1e9
    rows = []
    for B in args.batches:
        prompts = random_prompts(B, args.prompt, model.cfg.vocab_size)
        cfg = SamplingConfig(max_new_tokens=args.new)
        row = {"batch": B, "prompt": args.prompt, "new_tokens": args.new}
        generate(model, prompts, SamplingConfig(max_new_tokens=4))  # warm-up (capture included)
        t, outs = timed(lambda: generate(model, prompts, cfg), device)
        row["generate_s"] = t
        row["generate_ms_per_token"] = 1e3 * t / args.new
        t_capture, ms = captured_ms_per_step(model, prompts, args.new)
        by = step_bytes(model, B, args.prompt + args.new // 2)
        floor_ms = 1e3 * by["total"] / bw
        row.update({"graph_capture_s": t_capture, "graph_ms_per_step": ms, "graph_tokens_per_s": B / ms * 1e3,
                    "floor_ms_per_step": floor_ms, "fraction_of_floor": floor_ms / ms, "step_bytes": by})
        # Eager decode of the same batch (the path without graphs), a few steps.
        cache, logits = prefill(model, prompts, 16)
        t, _ = timed(lambda: decode_eager(model, cache, logits, 16), device)
        row["eager_ms_per_step"] = 1e3 * t / 16
        rows.append(row)
        print(json.dumps(row), flush=True)
        del cache
        torch.cuda.empty_cache()
    out["decode"] = rows


def step_profile(args, model, out):
    """torch.profiler over one eager decode step and over 4 replays of the captured step at batch 1:
    kernels per step, device time per kernel kind (benchmarks/common.KERNEL_KINDS), host syncs."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.common import kernel_breakdown

    prompts = random_prompts(1, args.prompt, model.cfg.vocab_size, seed=3)
    cache, logits = prefill(model, prompts, 16)
    tokens = logits.argmax(-1)
    for _ in range(2):
        tokens = model(tokens.unsqueeze(1), cache=cache).logits_BTV[:, 0].argmax(-1)
    torch.cuda.synchronize()
    res = {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        tokens = model(tokens.unsqueeze(1), cache=cache).logits_BTV[:, 0].argmax(-1)
        torch.cuda.synchronize()
    res["eager_step"] = kernel_breakdown(prof.key_averages())
    cache, logits = prefill(model, prompts, 16)
    step = GraphStep(model, cache.to_static(args.prompt + 32))
    tokens = logits.argmax(-1)
    for _ in range(3):
        tokens = step(tokens).argmax(-1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            tokens = step(tokens).argmax(-1)
        torch.cuda.synchronize()
    res["graph_4_replays"] = kernel_breakdown(prof.key_averages())
    out["step_profile_batch1"] = res
    for name, r in res.items():
        print(name, {k: (round(v["ms"], 3), v["launches"]) for k, v in r["kernels_by_kind"].items()}, flush=True)


def replay(step, tokens, n):
    for _ in range(n):
        tokens = step(tokens).argmax(-1)
    return tokens


def decode_eager(model, cache, logits, n):
    tokens = logits.argmax(-1)
    for _ in range(n):
        tokens = model(tokens.unsqueeze(1), cache=cache).logits_BTV[:, 0].argmax(-1)
    return tokens


def bench_mismatch(args, model_bf16, model_fp32, out):
    """model_logprobs (engine, bf16 weights, recurrent KDA + absorbed MLA) − score (training forward
    under bf16 autocast, fp32 master weights), on sampled sequences."""
    prompts = random_prompts(16, 128, model_bf16.cfg.vocab_size, seed=1)
    cfg = SamplingConfig(max_new_tokens=64, temperature=1.0)
    outs = generate(model_bf16, prompts, cfg, generator=torch.Generator(device="cuda").manual_seed(0))
    seqs = [p + o.token_ids for p, o in zip(prompts, outs)]
    lens = [len(p) for p in prompts]
    engine = torch.tensor([lp for o in outs for lp in o.model_logprobs])
    result = {"sequences": len(seqs), "tokens": engine.numel()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        train = torch.tensor([lp for s in score(model_fp32, seqs, lens) for lp in s])
    exact = torch.tensor([lp for s in score(model_fp32, seqs, lens) for lp in s])
    same = torch.tensor([lp for s in score(model_bf16, seqs, lens) for lp in s])
    for name, ref in (("vs_train_autocast_bf16", train), ("vs_score_fp32", exact), ("vs_score_same_bf16_model", same)):
        d = engine - ref
        q = torch.quantile(d.abs(), torch.tensor([0.5, 0.9, 0.99, 1.0]))
        result[name] = {"mean": d.mean().item(), "std": d.std().item(), "abs_p50": q[0].item(),
                        "abs_p90": q[1].item(), "abs_p99": q[2].item(), "abs_max": q[3].item(),
                        "seq_logratio_mean": (d.view(16, -1).sum(-1)).mean().item(),
                        "seq_logratio_abs_max": (d.view(16, -1).sum(-1)).abs().max().item()}
    out["logprob_mismatch"] = result
    print(json.dumps(result), flush=True)


def bench_mx_experts(args, model, out):
    """Decode with the routed experts packed to MXFP4 by the product's PTQ (k3model.quantize.convert_to_mx:
    kernels.mx.mx_linear_experts, MXFP8 activations) beside the same model's bf16 grouped-GEMM experts,
    in the same run, at each of --batches: the captured step (engine.GraphStep) and eager steps, and
    the MXFP4 captured step against its own eager step (logits, 8 steps)."""
    from k3model.quantize import convert_to_mx

    mx_model = convert_to_mx(copy.deepcopy(model))
    if args.fuse_projections:
        fuse_projections(mx_model)  # the MXLatentMoEs convert_to_mx swapped in come unfused
    check = {}
    check_graph(mx_model, check)
    rows = []
    for B in args.batches:
        prompts = random_prompts(B, args.prompt, model.cfg.vocab_size)
        row = {"batch": B}
        for name, m in (("bf16", model), ("mxfp4", mx_model)):
            row[f"{name}_graph_ms_per_step"] = captured_ms_per_step(m, prompts, args.new)[1]
            cache, logits = prefill(m, prompts, 16)
            t, _ = timed(lambda: decode_eager(m, cache, logits, 16), torch.device("cuda"))
            row[f"{name}_eager_ms_per_step"] = 1e3 * t / 16
        row["mxfp4_over_bf16_graph"] = row["mxfp4_graph_ms_per_step"] / row["bf16_graph_ms_per_step"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    out["mx_experts"] = {"graph_check": check["graph_check"], "rows": rows,
                         "weights": "random init (bf16), experts PTQ'd with convert_to_mx (ceil scales)"}


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--batches", default="1,64", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rollout-envs", type=int, default=8)
    ap.add_argument("--rollout-turns", type=int, default=2)
    ap.add_argument("--rollout-new", type=int, default=32)
    ap.add_argument("--skip", default="", help="CUDA parts to skip: routing_flips, diagnose, graph_check, "
                    "step_profile, decode, logprob_mismatch, mx_experts")
    ap.add_argument("--compile-regions", action="store_true",
                    help="CUDA: k3model.compiled.compile_regions on the bf16 model first")
    ap.add_argument("--fuse-projections", action="store_true",
                    help="k3model.fused.fuse_projections on the served model (bf16 on CUDA), as k3 serve loads it")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    out = header(args)
    cfg = get_profile(args.profile).model
    if args.device == "cpu":
        model = K3Model(cfg).eval()
        if args.fuse_projections:
            fuse_projections(model)
        bench_cpu(args, model, out)
    else:
        model_fp32 = K3Model(cfg).to(args.device).eval()
        model = copy.deepcopy(model_fp32).to(torch.bfloat16)
        for moe in model.moe_layers():
            moe.expert_bias_E.data = moe.expert_bias_E.data.float()
        skip = set(args.skip.split(","))
        if args.fuse_projections:
            fuse_projections(model)
        if args.compile_regions:
            from k3model.compiled import compile_regions

            compile_regions(model)
        # Each part reports its own failure and the JSON is rewritten after each, so a late failure
        # or the call's time limit keeps the figures already measured.
        parts = [("routing_flips", lambda: routing_flips(model, model_fp32, out)),
                 ("diagnose", lambda: diagnose(model, model_fp32, out)),
                 ("graph_check", lambda: check_graph(model, out)),
                 ("step_profile", lambda: step_profile(args, model, out)),
                 ("decode", lambda: bench_cuda(args, model, out)),
                 ("logprob_mismatch", lambda: bench_mismatch(args, model, model_fp32, out)),
                 ("mx_experts", lambda: bench_mx_experts(args, model, out))]
        for name, part in parts:
            if name in skip:
                continue
            try:
                part()
            except Exception as err:
                import traceback
                traceback.print_exc()
                out[name + "_error"] = repr(err)
            write(args.out, out)
    write(args.out, out)
    print("wrote", args.out)


def write(path, out):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
