"""Which target the draft should learn: a draft trained against the float student (what draft_model
did before issue 41 item 4) against one trained against the student's MXFP4 export (what `k3 serve`
runs), the same config, prompts and seed, measured where each claim applies. τ = 1 + accepted /
rounds, greedy, batch 1 (k3model.train.draft.measure_speculative).

    OMP_NUM_THREADS=1 python benchmarks/decode/draft_target.py --student MOPD_CKPT --quantized QUANT_CKPT \
        --sft-dir SFT_DATA_DIR --tokenizer TOKENIZER_JSON --profile smoke --steps 40 \
        --out benchmarks/results/decode/<date>_draft_target_<profile>_cpu.json

Rows of the JSON's `measured`:
  before_asset       the float-trained draft on the float target, on sft_data's held-out table prompts
                     (the old asset's own measurement: what it reported);
  before_served      the same draft on the served target (the MXFP4 export), on chat-formatted
                     held-out task prompts (what a user of `k3 serve` got);
  after_served       the draft trained against the served target, on the same chat prompts (the asset now);
  mtp_untrained      the served target's MTP module as a draft, on the same chat prompts.
Also how often the served and the float target's greedy tokens differ on the chat prompts (where a
float-trained draft learns the wrong token) and the two drafts' held-out τ_sim.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import run_header

from datagen.tokenizer import load_tokenizer
from k3model.checkpoint import load_model
from k3model.draft import draft_from_mtp, load_draft
from k3model.engine import SamplingConfig, context_length, generate
from k3model.quantize import load_quantized
from k3model.train.draft import DraftTrainConfig, chat_prompts, measure_speculative, table_prompts, train
from k3model.train.effort import training_harnesses
from k3model.train.recipes import eval_plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--student", required=True, help="the float mopd_student checkpoint")
    ap.add_argument("--quantized", required=True, help="its MXFP4 export (quantized_student)")
    ap.add_argument("--sft-dir", required=True, help="sft_data's directory (sft.parquet, heldout.parquet)")
    ap.add_argument("--tokenizer", required=True, help="the profile's tokenizer.json")
    ap.add_argument("--profile", default="smoke", help="whose held-out tasks (recipes.eval_plan)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--ttt-steps", type=int, default=4)
    ap.add_argument("--gen-tokens", type=int, default=16)
    ap.add_argument("--train-prompts", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=400, help="of the training prompts")
    ap.add_argument("--eval-prompts", type=int, default=8)
    ap.add_argument("--measure-prompts", type=int, default=8)
    ap.add_argument("--measure-tokens", type=int, default=16)
    ap.add_argument("--draft-lens", default="1,2,4")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    lens = tuple(int(k) for k in args.draft_lens.split(","))
    t0 = time.perf_counter()

    student, f_manifest = load_model(args.student, qat=False)
    served, q_manifest = load_quantized(args.quantized)
    student.eval(), served.eval()
    limit = context_length(served) or 1 << 20
    new = max(args.gen_tokens, args.measure_tokens)
    sft = Path(args.sft_dir)
    train_prompts = table_prompts(str(sft / "sft.parquet"), min(args.max_prompt_tokens, limit - new - 1),
                                  args.train_prompts)
    plan = eval_plan(args.profile)
    held = chat_prompts(load_tokenizer(args.tokenizer), plan.families, plan.efforts, training_harnesses(),
                        args.eval_prompts + args.measure_prompts, plan.seed, limit - new - 1)
    eval_ids = [p.ids for p in held[: args.eval_prompts]]
    measure = [p.ids for p in held[args.eval_prompts:]]
    # The old asset's measurement prompts: sft_data's held-out assistant turns after its eval ones.
    old = table_prompts(str(sft / "heldout.parquet"), min(args.max_prompt_tokens, limit - new - 1),
                        args.eval_prompts + args.measure_prompts)[args.eval_prompts:]

    cfg = DraftTrainConfig(seed=args.seed, steps=args.steps, batch_size=args.batch_size, ttt_steps=args.ttt_steps,
                           gen_tokens=args.gen_tokens, lr=args.lr, log_every=max(args.steps // 4, 1))
    drafts, tau_sim, seconds = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, target, manifest in (("float", student, f_manifest), ("served", served, q_manifest)):
            t = time.perf_counter()
            result = train(cfg, target, train_prompts, Path(tmp) / name, eval_prompts=eval_ids,
                           target_manifest=manifest)
            seconds[f"train_{name}"] = time.perf_counter() - t
            tau_sim[name] = {"untrained": result.metrics["draft/tau_sim_untrained"],
                             "trained": result.metrics["draft/tau_sim"]}
            drafts[name] = result.checkpoint_dir
            print(f"draft trained against the {name} target: τ_sim {tau_sim[name]}", flush=True)
        float_on_float = load_draft(drafts["float"], student)[0].eval()
        float_on_served = load_draft(drafts["float"], served)[0].eval()
        served_on_served = load_draft(drafts["served"], served)[0].eval()
        t = time.perf_counter()
        before_asset = measure_speculative(student, {"before_asset": float_on_float}, old, args.measure_tokens, lens)
        on_served = measure_speculative(served, {"before_served": float_on_served, "after_served": served_on_served,
                                                 "mtp_untrained": draft_from_mtp(served).eval()},
                                        measure, args.measure_tokens, lens)
        seconds["measure"] = time.perf_counter() - t

    sampling = SamplingConfig(max_new_tokens=args.measure_tokens)
    differ = total = 0
    for p in measure:
        a, b = generate(served, [p], sampling)[0].token_ids, generate(student, [p], sampling)[0].token_ids
        total += len(a)
        differ += sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
    measured = {**before_asset, **on_served}
    result = {"benchmark": "draft_target", "args": vars(args), "header": run_header(),
              "threads": torch.get_num_threads(),
              "student_sha256": f_manifest["sha256"], "quantized_sha256": q_manifest["sha256"],
              "prompts": {"train": len(train_prompts), "eval": len(eval_ids), "measure": len(measure),
                          "measure_tokens": [len(p) for p in measure],
                          "measure_families": [p.family for p in held[args.eval_prompts:]],
                          "old_measure": len(old)},
              "greedy_tokens_differing_served_vs_float": {"differ": differ, "of": total},
              "tau_sim": tau_sim, "seconds": {**seconds, "total": time.perf_counter() - t0},
              "measured": {n: {str(k): v for k, v in rows.items()} for n, rows in measured.items()}}
    for name, rows in measured.items():
        print(name, {k: (round(v["acceptance_length"], 3), v["greedy_parity"]) for k, v in rows.items()}, flush=True)
    print("greedy tokens differing, served vs float:", differ, "of", total)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
