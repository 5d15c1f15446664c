"""Where a speculative round's time goes (issue 20 item 5): the parts of one round timed in turns,
against one plain decode step of the engine (batch 1 padded to MIN_ROWS rows), on a trained target
and draft or on random tiny weights.

    OMP_NUM_THREADS=1 python benchmarks/probes/spec_round.py --target CKPT --draft DRAFT_CKPT \
        --prompts-table heldout.parquet --out benchmarks/results/decode/<date>_spec_round_tiny_cpu.json

Parts (median over reps, each rep runs every part once, in turn):
  plain_step   — engine.decode's step: target(tokens [4, 1]) over a 4-row cache (the prompt's row
                 padded to MIN_ROWS, as `generate` runs batch 1)
  verify_K     — target([x_n, d_1 … d_K]) into a recording cache, logits of every position, then
                 ModelCache.rollback to after x_n (a round that rejects the first draft), and back to
                 before it for the next rep
  draft_step   — one draft token: draft(g [1, 1, D], id) and the rollback of its cache
  draft_read_A — the draft re-reading A = a + 1 target features after a round (fuse + forward)
The round's model of cost: verify_K + draft_read_(a+1) + (K − 1) · draft_step, in plain steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from k3model.cache import ModelCache  # noqa: E402
from k3model.draft import target_features  # noqa: E402
from k3model.engine import MIN_ROWS  # noqa: E402


def main() -> None:
    from speculative import table_prompts, targets, trained_cases

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--prompts-table")
    ap.add_argument("--prompt-len", type=int, default=64, help="random prompt length (no --prompts-table)")
    ap.add_argument("--draft-lens", default="1,2,4,6")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.target:
        target, draft = trained_cases(args.target, args.draft)["trained" if args.draft else "mtp_untrained"]
        prompt = table_prompts(args.prompts_table, 1, 400)[0] if args.prompts_table else list(range(1, args.prompt_len + 1))
    else:
        target, draft = targets(args.profile, 0)["predictable"]
        prompt = list(range(1, args.prompt_len + 1))
    draft_lens = [int(k) for k in args.draft_lens.split(",")]
    K_max = max(draft_lens)
    D = target.cfg.d_model
    ids = lambda tokens: torch.tensor([tokens])  # noqa: E731

    with torch.no_grad(), target_features(target, draft) as seen:
        cache = ModelCache.empty(target, 1, capacity=len(prompt) + 64, max_rollback=K_max + 1)
        out = target(ids(prompt), cache=cache, logits=False)
        plain_cache = ModelCache.empty(target, 1, capacity=len(prompt) + 64)
        target(ids(prompt), cache=plain_cache, logits=False)
        plain4 = plain_cache.select([0] * MIN_ROWS)
        n = cache.length
        f = draft.fuse_features([seen["low"], seen["mid"], out.hidden_BTD])
        dcache = ModelCache.empty(draft, 1, capacity=len(prompt) + 64, max_rollback=K_max + 1)
        draft(f, ids(prompt[1:] + [5]), dcache)
        dn = dcache.length
        g_11D = torch.randn(1, 1, D)
        feats = [torch.randn(1, K_max + 1, D) for _ in range(3)]

        def plain_step():
            target(torch.full((MIN_ROWS, 1), 7), cache=plain4)
            plain4.lengths = [n] * MIN_ROWS  # the MLA entry is rewritten next time; KDA state moves on

        def verify(K):
            def run():
                target(ids([7] * (K + 1)), cache=cache)
                cache.rollback(n + 1)  # keep x_n only: the KDA states after it are rebuilt
                cache.rollback(n)
            return run

        def draft_step():
            draft(g_11D, ids([9]), dcache)
            dcache.rollback(dn)

        def draft_read(A):
            def run():
                draft(draft.fuse_features([t[:, :A] for t in feats]), ids([9] * A), dcache)
                dcache.rollback(dn)
            return run

        parts = {"plain_step": plain_step, "draft_step": draft_step}
        for K in draft_lens:
            parts[f"verify_{K}"] = verify(K)
        for A in sorted({1, 2, 3, 4, K_max + 1}):
            parts[f"draft_read_{A}"] = draft_read(A)
        times = {name: [] for name in parts}
        for _ in range(10):
            for fn in parts.values():
                fn()
        for _ in range(args.reps):
            for name, fn in parts.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    step = med["plain_step"]
    for name, ms in med.items():
        print(f"{name:14s} {ms:7.3f} ms  {ms / step:5.2f} plain steps", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"benchmark": "spec_round", "args": vars(args), "commit": commit, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "prompt_tokens": len(prompt),
              "median_ms": med, "in_plain_steps": {k: v / step for k, v in med.items()}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
