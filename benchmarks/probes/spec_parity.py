"""Where greedy speculative decoding leaves the plain greedy output, and why: a numerical near-tie
between the decode path and the verify path, or a wrong token.

    python benchmarks/probes/spec_parity.py --profile small --device cuda --dtype fp32 --out OUT.json

Random weights (benchmarks/speculative.py's `mtp` case). For each prompt: the plain greedy tokens
(engine.generate, the recurrent decode) and the speculative ones (draft length K); at the first
position where they differ, the teacher-forced logits of the plain sequence through the chunked
forward (the path a verify takes) give the gap between the two tokens there. A gap of the order of
the two paths' logit difference (`max_abs_logit_diff` over the common prefix) is a near-tie that
either path may break its own way; a gap far above it is a wrong token.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.common import run_header
from k3model.config import get_profile
from k3model.draft import draft_from_mtp
from k3model.engine import SamplingConfig, generate
from k3model.model import K3Model
from k3model.speculative import speculative_generate


def teacher_forced_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids], device=next(model.parameters()).device)).logits_BTV[0].float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--draft-len", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    target = K3Model(get_profile(args.profile).model).eval()
    draft = draft_from_mtp(target)
    target, draft = target.to(args.device, dtype), draft.to(args.device, dtype)
    V = target.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    cfg = SamplingConfig(max_new_tokens=args.new)
    rows = []
    for _ in range(args.prompts):
        prompt = torch.randint(0, V, (args.prompt_len,), generator=g).tolist()
        plain = generate(target, [prompt], cfg)[0]
        spec, _ = speculative_generate(target, draft, prompt, cfg, args.draft_len)
        row = {"parity": spec == plain.token_ids, "plain": plain.token_ids, "speculative": spec}
        logits_TV = teacher_forced_logits(target, prompt + plain.token_ids)
        chunked_logp = torch.log_softmax(logits_TV, -1)
        P = len(prompt)
        # The plain path's recorded log-probabilities against the chunked path's, over the whole output.
        recorded = torch.tensor(plain.model_logprobs)
        rescored = chunked_logp[P - 1:P - 1 + len(plain.token_ids)].gather(
            -1, torch.tensor(plain.token_ids, device=logits_TV.device)[:, None])[:, 0].cpu()
        row["max_abs_logprob_diff_recurrent_vs_chunked"] = float((recorded - rescored).abs().max())
        chunked_argmax = logits_TV[P - 1:P - 1 + len(plain.token_ids)].argmax(-1).tolist()
        row["chunked_argmax_agrees_with_plain"] = sum(a == b for a, b in zip(chunked_argmax, plain.token_ids))
        if not row["parity"]:
            i = next((j for j, (a, b) in enumerate(zip(spec, plain.token_ids)) if a != b),
                     min(len(spec), len(plain.token_ids)))
            row["first_difference"] = i
            if i < len(plain.token_ids) and i < len(spec):
                z = logits_TV[P - 1 + i]
                top2 = z.topk(2)
                row["at_difference"] = {
                    "plain_token": plain.token_ids[i], "speculative_token": spec[i],
                    "chunked_logit_plain_token": float(z[plain.token_ids[i]]),
                    "chunked_logit_speculative_token": float(z[spec[i]]),
                    "chunked_top2_gap": float(top2.values[0] - top2.values[1]),
                    "chunked_top2_ids": top2.indices.tolist(),
                }
        rows.append(row)
        print({k: v for k, v in row.items() if k not in ("plain", "speculative")}, flush=True)
    out = {**run_header(), "args": vars(args), "rows": rows,
           "parity": f"{sum(r['parity'] for r in rows)}/{len(rows)}"}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print("parity", out["parity"])


if __name__ == "__main__":
    main()
