"""Speculative decoding (k3model/speculative.py) against plain decoding through the same engine, in
the same run: acceptance length τ and tokens/s at draft lengths 1–6, greedy, batch 1.

    # a trained target and draft, held-out prompts (the assistant-turn prompts of a datagen.sft table;
    # --prompt-offset 16 gives the tiny draft_model asset's own measurement prompts):
    OMP_NUM_THREADS=1 python benchmarks/decode/speculative.py --target CKPT --draft DRAFT_CKPT \
        --prompts-table heldout.parquet --prompt-offset 16 --cases trained --min-draft-probs none,0.7 \
        --out benchmarks/results/decode/<date>_speculative_tiny_trained_cpu.json
    # the served target (quantized_student's MXFP4 export) and its draft, on the chat-formatted first turns
    # of held-out envs tasks (the draft_model asset's measurement prompts on a profile: --prompt-offset = its
    # draft_eval_prompts):
    OMP_NUM_THREADS=1 python benchmarks/decode/speculative.py --target QUANTIZED_CKPT --draft DRAFT_CKPT \
        --chat-prompts TOKENIZER_JSON --profile tiny --prompt-offset 16 --cases trained,mtp_untrained --out …
    # random weights (no checkpoints given):
    OMP_NUM_THREADS=1 python benchmarks/decode/speculative.py --profile tiny --out benchmarks/results/decode/<date>_speculative_tiny_cpu.json

With --target (a float checkpoint, or an MXFP4 export, loaded as `k3 serve` loads it), two cases
on the same target and prompts: `mtp_untrained` (draft_from_mtp(target), the MTP module as a draft
without training) and `trained` (the --draft checkpoint, k3model.draft.load_draft); --draft2 adds a
second trained draft (`trained2`: e.g. one fitted to another target, measured against this one).
τ = 1 + accepted / rounds, pooled over every call's drafting rounds (`acceptance_length`; the mean
of the per-call figures is `acceptance_length_mean_of_calls`).
Tokens/s is end to end (prefill included, the same prompt for both); the per-round
figures (`decode_tokens_per_s`, prefill excluded) come from timing the prefill alone.

Without --target, two targets of the profile's shape, both random weights:
  mtp        — a random target with its own (random) MTP module as the draft: the untrained case,
               τ ≈ 1, so this measures the overhead a useless draft costs;
  predictable — the same shape with a large embedding (norm --predictable-scale) that the output head
               reads through a fixed permutation (the next token mostly follows the current one), and the MTP draft with
               its merge reading only the token embedding: a synthetic case where drafts are often
               right, to show what the loop gains at a given τ.
Every speculative output is compared with the plain greedy output (parity recorded). On CUDA with
bf16 weights, plain decoding replays the engine's captured step and greedy speculative decoding one
captured round (k3model/speculative.py GreedyRound), each captured once and reused across calls
(the warm-up captures them); --compile-regions compiles both models first. Repetitions
are interleaved (plain, then each draft length, per prompt); the 2-core machine is shared, so the
ratio to plain decoding is the figure, not the absolute tokens/s: `speedup` pools every call's
tokens and seconds, `speedup_median` is the median over calls of (plain seconds / speculative
seconds) for the same prompt, timed next to each other (less moved by load that comes and goes),
`speedup_cpu_time` the pooled ratio by this process's CPU time (what other processes' load does
not add to, as waiting for a core; one intra-op thread, so equal to wall time on an idle machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch

from benchmarks.common import run_header

from k3model.config import get_profile
from k3model.draft import draft_from_mtp, load_draft
from k3model.engine import SamplingConfig, generate
from k3model.model import K3Model
from k3model.speculative import speculative_generate


def targets(profile: str, seed: int, scale: float = 3.0):
    torch.manual_seed(seed)
    cfg = get_profile(profile).model
    random_target = K3Model(cfg).eval()
    torch.manual_seed(seed + 1)
    predictable = K3Model(cfg).eval()
    D, V = cfg.d_model, cfg.vocab_size
    with torch.no_grad():
        predictable.embed.weight.mul_(scale / 0.02 / D ** 0.5)
        predictable.lm_head.weight.copy_(predictable.embed.weight[torch.randperm(V).argsort()])
    aligned = draft_from_mtp(predictable)
    with torch.no_grad():
        aligned.merge.weight.zero_()
        aligned.merge.weight[:, D:] = torch.eye(D)
    return {"mtp": (random_target, draft_from_mtp(random_target)), "predictable": (predictable, aligned)}


def trained_cases(target_dir: str, draft_dir: str | None, draft2_dir: str | None = None):
    from k3model.checkpoint import load_model, read_manifest
    from k3model.quantize import is_quantized_manifest, load_quantized
    if is_quantized_manifest(read_manifest(target_dir)):
        target, _ = load_quantized(target_dir)
    else:
        target, _ = load_model(target_dir, qat=False)
    target.eval()
    cases = {"mtp_untrained": (target, draft_from_mtp(target).eval())}
    if draft_dir:
        cases["trained"] = (target, load_draft(draft_dir, target)[0].eval())
    if draft2_dir:
        cases["trained2"] = (target, load_draft(draft2_dir, target)[0].eval())
    return cases


def heldout_chat_prompts(tokenizer_path: str, profile: str, n: int, max_tokens: int) -> list[list[int]]:
    """The first `n` chat-formatted held-out task prompts the draft_model asset draws on `profile`."""
    from datagen.tokenizer import load_tokenizer
    from k3model.train.draft import chat_prompts
    from k3model.train.effort import training_harnesses
    from k3model.train.recipes import eval_plan
    plan = eval_plan(profile)
    return [p.ids for p in chat_prompts(load_tokenizer(tokenizer_path), plan.families, plan.efforts,
                                        training_harnesses(), n, plan.seed, max_tokens)]


def table_prompts(path: str, n: int, max_prompt_tokens: int) -> list[list[int]]:
    from datagen.io import read_parquet
    from k3model.train.draft import prompts_from_demonstrations
    table = read_parquet(path)
    prompts = prompts_from_demonstrations(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(),
                                          max_prompt_tokens)
    return prompts[:n]


def early(p: float | None) -> dict:
    """speculative_generate's keyword for an early-ending chain (none for a fixed one, so older
    library versions run too, for A/B against a commit)."""
    return {} if p is None else {"min_draft_prob": p}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--draft-lens", default="1,2,3,4,5,6")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", help="a target checkpoint (k3model.checkpoint.load_model reads it)")
    ap.add_argument("--draft", help="a trained draft checkpoint for --target (k3model.train.draft)")
    ap.add_argument("--draft2", help="another draft checkpoint for --target (case trained2)")
    ap.add_argument("--prompts-table", help="held-out prompts: a datagen.sft Parquet table")
    ap.add_argument("--chat-prompts", help="a tokenizer.json: the chat-formatted first turns of --profile's held-out "
                    "envs tasks (k3model.train.draft.chat_prompts), at most --max-prompt-tokens long")
    ap.add_argument("--max-prompt-tokens", type=int, default=400)
    ap.add_argument("--prompt-offset", type=int, default=0, help="skip this many table prompts (the draft_model "
                    "asset measures on the held-out prompts after its 16 tiny eval prompts: 16)")
    ap.add_argument("--min-draft-probs", default="none", help="comma-separated min_draft_prob values of "
                    "speculative_generate to run at every draft length ('none': the fixed chain)")
    ap.add_argument("--inference-mode", action="store_true", help="run plain and speculative decoding alike "
                    "inside torch.inference_mode() (the library runs them under no_grad; this measures what "
                    "inference mode would save both)")
    ap.add_argument("--cases", help="comma-separated subset of the cases to run (default: all)")
    ap.add_argument("--reps", type=int, default=2, help="interleaved repetitions over the prompts")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the target and draft move there)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), help="weights of the target and draft (default: bf16 on "
                    "cuda, where the engine's captured decode step needs the grouped expert GEMM's bf16 "
                    "kernel — torch._grouped_mm's fp32 fallback reads the expert offsets on the host —, "
                    "fp32 on the CPU)")
    ap.add_argument("--predictable-scale", type=float, default=3.0, help="the predictable case's embedding norm: "
                    "how far the token's embedding outweighs what the layers add to the final hidden state (3 on "
                    "tiny: the target follows its permutation at ~every position; small needs ~12 for ~70 %%)")
    ap.add_argument("--compile-regions", action="store_true", help="k3model.compiled.compile_regions on the target "
                    "and the draft (CUDA): plain and speculative decoding then replay compiled captured graphs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    draft_lens = [int(k) for k in args.draft_lens.split(",")]
    probs = [None if p == "none" else float(p) for p in args.min_draft_probs.split(",")]
    # (key, draft length, min_draft_prob): "4" is a fixed chain of 4, "4/p0.5" one that stops early.
    variants = [(str(k) if p is None else f"{k}/p{p:g}", k, p) for p in probs for k in draft_lens]
    result = {"benchmark": "speculative", "args": vars(args), "header": run_header(),
              "threads": torch.get_num_threads(),
              "weights": (f"target {args.target}, draft {args.draft}" if args.target else
                          "random; see the module docstring"), "cases": {}}
    g = torch.Generator().manual_seed(args.seed)
    cfg = SamplingConfig(max_new_tokens=args.new)
    cases = (trained_cases(args.target, args.draft, args.draft2) if args.target
             else targets(args.profile, args.seed, args.predictable_scale))
    if args.cases:
        cases = {name: cases[name] for name in args.cases.split(",")}
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype or ("bf16" if args.device == "cuda" else "fp32")]
    result["dtype"] = str(dtype)
    mode = torch.inference_mode() if args.inference_mode else contextlib.nullcontext()
    with mode:
        for name, (target, draft) in cases.items():
            result["cases"][name] = run_case(name, target, draft, args, variants, cfg, g, dtype)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def run_case(name, target, draft, args, variants, cfg, g, dtype) -> dict:
    """One case (a target and its draft): plain decoding and every variant, interleaved per prompt."""
    target, draft = target.to(args.device, dtype), draft.to(args.device, dtype)
    if args.compile_regions:
        from k3model.compiled import compile_regions
        compile_regions(target), compile_regions(draft)
    V = target.cfg.vocab_size
    if args.chat_prompts:
        prompts = heldout_chat_prompts(args.chat_prompts, args.profile, args.prompt_offset + args.prompts,
                                       args.max_prompt_tokens)[args.prompt_offset:]
    elif args.prompts_table:
        prompts = table_prompts(args.prompts_table, args.prompt_offset + args.prompts,
                                args.max_prompt_tokens)[args.prompt_offset:]
    else:
        prompts = [torch.randint(0, V, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]
    # Warm-up: every path once at the timed budget (first calls build kernels and allocate; on CUDA
    # they capture the graphs that later calls of the same capacity reuse).
    generate(target, prompts[:1], cfg)
    for _, k, p in variants:
        speculative_generate(target, draft, prompts[0], cfg, k, **early(p))
    plain_s, plain_cpu, tokens, prefill_s = 0.0, 0.0, 0, 0.0
    per_k = {key: {"seconds": 0.0, "cpu_seconds": 0.0, "tokens": 0, "tau": [], "parity": 0, "forwards": 0, "ratios": [],
                   "rounds": 0, "drafts_accepted": 0, "reached": [0] * k, "accepted": [0] * k} for key, k, _ in variants}
    for prompt in [p for _ in range(args.reps) for p in prompts]:
        t = time.perf_counter()
        generate(target, [prompt], SamplingConfig(max_new_tokens=1))
        prefill_s += time.perf_counter() - t
        t, c = time.perf_counter(), time.process_time()
        expected = generate(target, [prompt], cfg)[0].token_ids
        plain_one, plain_cpu_one = time.perf_counter() - t, time.process_time() - c
        plain_s += plain_one
        plain_cpu += plain_cpu_one
        tokens += len(expected)
        for key, k, p in variants:
            t, c = time.perf_counter(), time.process_time()
            out, stats = speculative_generate(target, draft, prompt, cfg, k, **early(p))
            seconds, cpu_seconds = time.perf_counter() - t, time.process_time() - c
            row = per_k[key]
            row["seconds"] += seconds
            row["cpu_seconds"] += cpu_seconds
            row["ratios"].append(plain_one / seconds * len(out) / max(len(expected), 1))
            row["tokens"] += len(out)
            row["tau"].append(stats.acceptance_length)
            row["rounds"] += stats.rounds
            row["drafts_accepted"] += stats.accepted
            row["parity"] += out == expected
            row["forwards"] += stats.target_forwards
            row["reached"] = [a + b for a, b in zip(row["reached"], stats.reached_at_depth)]
            row["accepted"] = [a + b for a, b in zip(row["accepted"], stats.accepted_at_depth)]
    plain_tps = tokens / plain_s
    plain_decode_tps = tokens / max(plain_s - prefill_s, 1e-9)
    case = {"plain_tokens_per_s": plain_tps, "plain_decode_tokens_per_s": plain_decode_tps,
            "prefill_s_per_prompt": prefill_s / (len(prompts) * args.reps), "by_draft_len": {}}
    for key, row in per_k.items():
        tps = row["tokens"] / row["seconds"]
        decode_tps = row["tokens"] / max(row["seconds"] - prefill_s, 1e-9)
        case["by_draft_len"][key] = {
            "acceptance_length": 1.0 + row["drafts_accepted"] / max(row["rounds"], 1),
            "acceptance_length_mean_of_calls": sum(row["tau"]) / len(row["tau"]),
            "rounds": row["rounds"], "tokens_per_s": tps,
            "speedup": tps / plain_tps, "speedup_median": statistics.median(row["ratios"]),
            "speedup_cpu_time": (row["tokens"] / row["cpu_seconds"]) / (tokens / plain_cpu),
            "decode_tokens_per_s": decode_tps,
            "decode_speedup": decode_tps / plain_decode_tps,
            "greedy_parity": f"{row['parity']}/{len(prompts) * args.reps}",
            "tokens_per_target_forward": row["tokens"] / row["forwards"],
            "acceptance_by_depth": [a / r if r else None for a, r in zip(row["accepted"], row["reached"])]}
        print(f"{name} k={key}: tau {case['by_draft_len'][key]['acceptance_length']:.2f}  "
              f"{tps:.1f} tok/s vs plain {plain_tps:.1f} ({tps / plain_tps:.2f}x, median of calls "
              f"{statistics.median(row['ratios']):.2f}x, by CPU time "
              f"{case['by_draft_len'][key]['speedup_cpu_time']:.2f}x; decode only {decode_tps / plain_decode_tps:.2f}x)  "
              f"parity {row['parity']}/{len(prompts) * args.reps}",
              flush=True)
    return case


if __name__ == "__main__":
    main()
