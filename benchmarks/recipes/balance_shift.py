"""Why a balanced checkpoint's held-out expert load exceeds its training-time load (claim 2, issue 43).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 10 python benchmarks/recipes/balance_shift.py \
        --lineage /tmp/fresh-run3/.k3 --profile tiny

For each pretraining stage's final checkpoint of a materialized lineage (`<home>/checkpoints/<profile>/
pretrain_stage_<s>/<run>/`, data from `<home>/data/<profile>/`), the token-aggregated load max/mean
(k3model.train.expert_load.load_stats: max_j load_j / mean_j load_j, mean over MoE layers) of:

- `train_tail`: the stage's own training rows of its last 10 % of steps (rebuilt by StageBatches from
  the manifest's seed, stage and shape), run through the final weights and bias in eval mode: the
  rows the balancer fitted the bias to, as against
- `heldout`: the fixed held-out mixed set claim 2 is judged on (expert_load.mixed_heldout_set);

each in total and per row kind (text, clue, image), with the bias and with it zeroed, and the rows'
token share per kind. If `train_tail` sits near the training metric `moe/train_tail_load_max_over_mean`
and `heldout` does not, the gap is the data the bias was fitted to, not the model's mode or the
measurement; the per-kind figures say which rows move the load.

`--rates 1,0.1` instead trains: for each η of the quantile bias update (MoEConfig.quantile_window_tokens
set to the stage's tokens per step / η, so η = min(1, M / W) is exactly that),
stages `--train-stages` of the profile, each from the lineage's previous-stage checkpoint (stage 1
from random weights), for `--steps` steps (0: the stage's own), and reports training-side figures only:
the per-step load of the last 10 % of steps (each batch routed with a bias not fitted to it), the
stage's `moe/train_tail_*` (loads summed over its last 10 % of tokens) and the final weights and bias
over those same training rows (`frozen_tail`: what one frozen bias does to the rows it trained on).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 10 python benchmarks/recipes/balance_shift.py \
        --lineage /tmp/fresh-run3/.k3 --rates 1,0.1 --train-stages 2,4 --steps 0

`--replay-rates 1,0.1 --stages 2,3,4` is the cheap version on a 2-core machine: each stage's balancer
replayed on its final weights (forward only, the stage's batches in order, the bias updated after each
from the one the stage started with), reporting the same training-side figures plus `frozen_next`: the
final bias over the next 32,768 tokens the stage's data stream gives after its last step (training rows
it never saw). `--heldout` adds the held-out mixed set's load under the replayed bias.

`--arms` trains the `balancing_ablation` asset's two arms on the lineage's data outside Dagster and
measures their held-out load (claim 2's "without balancing" at tiny) and each arm's wall time.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import ROOT, run_header, write_json
from k3model.checkpoint import load_model
from k3model.train.expert_load import expert_load, load_stats, mixed_heldout_set
from k3model.train.pretrain import PretrainConfig
from k3model.train.pretrain_data import PretrainData, StageBatches, pixels_to_tensor


def lineage_data(home: Path, profile: str) -> PretrainData:
    import datagen
    root = home / "data" / profile

    def newest(asset: str, name: str) -> Path:
        return max((root / asset).glob(f"*/{name}"), key=lambda p: p.stat().st_mtime)
    return PretrainData(newest("tokenizer", "tokenizer.json"), newest("corpus", "corpus.parquet"),
                        newest("image_data", "images.parquet"), newest("clue_data", "clue_eval.parquet"),
                        clues=datagen.presets(profile).clues)


@torch.no_grad()
def rows_load(model, batches: StageBatches, rows: np.ndarray, zero_bias: bool, chunk: int = 8) -> torch.Tensor:
    """[layers, experts] loads of training rows `rows` (indices into the packed stage)."""
    moes = model.moe_layers()
    saved = [m.expert_bias_E.clone() for m in moes]
    total_NE = torch.zeros(len(moes), moes[0].cfg.n_routed, dtype=torch.float64)
    try:
        if zero_bias:
            for m in moes:
                m.expert_bias_E.zero_()
        for s in range(0, len(rows), chunk):
            idx = rows[s: s + chunk]
            ids_BT = torch.from_numpy(batches._rows["input_ids"][idx])
            image_ids = [i for r in idx for i in batches._rows["image_ids"][r]]
            images = pixels_to_tensor(batches.data.image_pixels_NHWC[image_ids]) if image_ids else None
            model(ids_BT, images, ids_BT == batches.image_token if image_ids else None)
            total_NE += torch.stack([m.last_load.double() for m in moes])
    finally:
        for m, b in zip(moes, saved):
            m.expert_bias_E.copy_(b)
    return total_NE


def stage_figures(checkpoint: Path, data: PretrainData, heldout_sets: dict) -> dict:
    model, manifest = load_model(checkpoint, "cpu")
    model.eval()
    pre, resolved = manifest["config"]["pretrain"], manifest["config"]["resolved"]
    steps, bsz, seq = resolved["steps"], resolved["batch_size"], resolved["seq_len"]
    batches = stage_batches(model.cfg, pre, resolved, data)
    tail_from = int(0.9 * steps)
    rows = np.arange(tail_from * bsz, steps * bsz)
    kinds = np.array(batches._rows["kind"])[rows]
    k = model.cfg.top_k
    out = {"stage": pre["stage"], "steps": steps, "batch": [bsz, seq], "tail_steps": steps - tail_from,
           "train_metric_tail": manifest.get("metrics", {}).get("moe/train_tail_load_max_over_mean"),
           "bias_by_layer": [[round(float(b), 4) for b in m.expert_bias_E] for m in model.moe_layers()]}
    for zero in (False, True):
        arm = "bias_zeroed" if zero else "with_bias"
        total = rows_load(model, batches, rows, zero)
        tail = {"all": load_stats(total, k)["load_max_over_mean"], "tokens": int(len(rows) * seq),
                "token_share": {}}
        for kind in sorted(set(kinds)):
            sel = rows[kinds == kind]
            tail[kind] = load_stats(rows_load(model, batches, sel, zero), k)["load_max_over_mean"]
            tail["token_share"][kind] = round(len(sel) / len(rows), 3)
        key = (tuple(model.cfg.vision.__dict__.values()) if model.cfg.vision is not None else None)
        if key not in heldout_sets:
            vision = model.cfg.vision
            heldout_sets[key] = mixed_heldout_set(data, vision.tokens_per_image if vision is not None else None)
        held = expert_load(model, heldout_sets[key], "cpu", zero_bias=zero)
        out[arm] = {"train_tail": tail,
                    "heldout": {"all": held["load_max_over_mean"], **held["by_kind"],
                                "tokens": held["tokens"], "token_share": {
                                    kk: round(v / held["tokens"], 3) for kk, v in held["tokens_by_kind"].items()}}}
    print(json.dumps(out), flush=True)
    return out


NEXT_TOKENS = 32_768


def window_for(rate: float, tokens_per_step: int) -> int:
    """The MoEConfig.quantile_window_tokens W that gives η = min(1, M / W) = `rate` at M tokens a step
    (0, the overwrite, for η = 1)."""
    return 0 if rate >= 1.0 else round(tokens_per_step / rate)


def stage_batches(model_cfg, pre: dict, resolved: dict, data: PretrainData, extra_rows: int = 0) -> StageBatches:
    bsz, steps = resolved["batch_size"], resolved["steps"]
    batches = StageBatches(data, model_cfg, seq_len=resolved["seq_len"], batch_size=bsz, seed=pre["seed"],
                           stage=pre["stage"], clue_fraction=pre["clue_fraction"],
                           image_fraction=pre["image_fraction"], clue_loss=pre["clue_loss"],
                           clue_warmup_rows=min(resolved["clue_warmup_steps"], steps) * bsz)
    batches.pack(steps * bsz + extra_rows)
    return batches


def rate_run(data: PretrainData, home: Path, profile: str, stage: int, rate: float, steps: int, out: Path) -> dict:
    import time

    from k3model.train.pretrain import train
    init = None
    if stage > 1:
        runs = sorted((home / "checkpoints" / profile / f"pretrain_stage_{stage - 1}").glob("*/manifest.json"),
                      key=lambda p: p.stat().st_mtime)
        init = runs[-1].parent
    shape = PretrainConfig(profile=profile, stage=stage).resolved()
    cfg = PretrainConfig(profile=profile, stage=stage, seed=0, steps=steps or None,
                         quantile_window_tokens=window_for(rate, shape.batch_size * shape.seq_len),
                         ckpt_every=10**6, log_every=10**6, eval_examples_per_cell=1, eval_max_length=64,
                         eval_ppl_windows=1, eval_vqa_questions=1)
    t0 = time.perf_counter()
    result = train(cfg, data, out / f"s{stage}_rate{rate:g}", init_checkpoint=init)
    wall = time.perf_counter() - t0
    model, manifest = load_model(result.checkpoint_dir, "cpu")  # the frozen-bias pass on the CPU, in fp32
    model.eval()
    resolved = manifest["config"]["resolved"]
    n_steps = resolved["steps"]
    tail_from = int(0.9 * n_steps)
    per_step = [h["moe/load_max_over_mean"] for h in result.history if h["step"] > tail_from]
    batches = stage_batches(model.cfg, manifest["config"]["pretrain"], resolved, data)
    rows = np.arange(tail_from * resolved["batch_size"], n_steps * resolved["batch_size"])
    frozen = load_stats(rows_load(model, batches, rows, False), model.cfg.top_k)
    row = {"stage": stage, "rate": rate, "steps": n_steps, "tail_steps": n_steps - tail_from,
           "per_step_tail_mean": float(np.mean(per_step)), "per_step_tail_max": float(np.max(per_step)),
           "train_tail": result.eval.get("moe/train_tail_load_max_over_mean"),
           "train_tail_worst": result.eval.get("moe/train_tail_load_max_over_mean_worst"),
           "train_tail_dead": result.eval.get("moe/train_tail_dead_fraction"),
           "frozen_tail": frozen["load_max_over_mean"], "frozen_tail_worst": frozen["load_max_over_mean_worst"],
           "train_final_loss": result.eval.get("train/final_loss"), "wall_s": wall,
           "per_step_curve": [round(h["moe/load_max_over_mean"], 3) for h in result.history]}
    print(json.dumps({k: v for k, v in row.items() if k != "per_step_curve"}), flush=True)
    return row


@torch.no_grad()
def replay(home: Path, profile: str, stage: int, rate: float, data: PretrainData, heldout: bool = False) -> dict:
    """The stage's balancer replayed on its final weights: every batch of the stage in order, forward
    only (train mode, so the statistics are gathered), the bias updated after each with rate η from
    the bias the stage started with (the previous stage's final one; 0 for stage 1). The weights
    stay fixed, so the figures are the balancer's alone; all on training rows."""
    def final(s: int) -> Path:
        return sorted((home / "checkpoints" / profile / f"pretrain_stage_{s}").glob("*/manifest.json"),
                      key=lambda p: p.stat().st_mtime)[-1].parent
    model, manifest = load_model(final(stage), "cpu")
    moes = model.moe_layers()
    start = [torch.zeros_like(m.expert_bias_E) for m in moes]
    if stage > 1:
        previous, _ = load_model(final(stage - 1), "cpu")
        start = [m.expert_bias_E.clone() for m in previous.moe_layers()]
    window = window_for(rate, manifest["config"]["resolved"]["batch_size"] * manifest["config"]["resolved"]["seq_len"])
    for m, b in zip(moes, start):
        m.cfg = replace(m.cfg, quantile_window_tokens=window)
        m.expert_bias_E.copy_(b)
    resolved = manifest["config"]["resolved"]
    steps, bsz, seq = resolved["steps"], resolved["batch_size"], resolved["seq_len"]
    # The stage's rows and, after them, the rows its data stream would have given next: at least
    # `NEXT_TOKENS` training tokens the final bias was never fitted to.
    n_next = -(-NEXT_TOKENS // seq)
    batches = stage_batches(model.cfg, manifest["config"]["pretrain"], resolved, data, extra_rows=n_next)
    tail_from = int(0.9 * steps)
    model.train()
    per_step, tail_NE = [], torch.zeros(len(moes), moes[0].cfg.n_routed, dtype=torch.float64)
    for step in range(steps):
        b = batches.batch(step)
        model(b.input_ids, b.images, b.image_mask)
        loads_NE = torch.stack([m.last_load.double() for m in moes])
        per_step.append(float((loads_NE.max(-1).values / loads_NE.mean(-1)).mean()))
        if step >= tail_from:
            tail_NE += loads_NE
        for m in moes:
            m.update_bias()
    model.eval()
    rows = np.arange(tail_from * bsz, steps * bsz)
    frozen = load_stats(rows_load(model, batches, rows, False), model.cfg.top_k)
    following = np.arange(steps * bsz, steps * bsz + n_next)
    after = load_stats(rows_load(model, batches, following, False), model.cfg.top_k)
    row = {"stage": stage, "rate": rate, "steps": steps, "tail_steps": steps - tail_from,
           "next_rows": int(n_next), "next_tokens": int(n_next * seq),
           "frozen_next": after["load_max_over_mean"], "frozen_next_worst": after["load_max_over_mean_worst"],
           "per_step_tail_mean": float(np.mean(per_step[tail_from:])),
           "replay_tail": load_stats(tail_NE, model.cfg.top_k)["load_max_over_mean"],
           "frozen_tail": frozen["load_max_over_mean"], "frozen_tail_worst": frozen["load_max_over_mean_worst"],
           "trained_tail": manifest.get("metrics", {}).get("moe/train_tail_load_max_over_mean"),
           "per_step_curve": [round(x, 3) for x in per_step]}
    if heldout:
        # Claim 2's figure with the replayed bias (`--heldout`; measured only after the change it
        # would judge was written down, docs/log/pretrain.md 2026-12-06).
        vision = model.cfg.vision
        held = expert_load(model, mixed_heldout_set(data, vision.tokens_per_image if vision is not None else None))
        row["heldout"] = held["load_max_over_mean"]
        row["heldout_worst"] = held["load_max_over_mean_worst"]
        row["heldout_by_kind"] = held["by_kind"]
    print(json.dumps({k: v for k, v in row.items() if k != "per_step_curve"}), flush=True)
    return row


def arms_run(data: PretrainData, profile: str, out: Path, steps: int | None) -> dict:
    """The balancing_ablation asset's two arms (k3model.train.pretrain.balancing_arms) trained one after
    the other in this process, each final checkpoint's held-out load with and without its bias, and
    each arm's wall time."""
    import time

    from k3model.train.expert_load import checkpoint_expert_load, flat_metrics
    from k3model.train.pretrain import balancing_arms, train
    rows = {}
    held_set = None
    for arm, cfg in balancing_arms(profile, steps=steps).items():
        t0 = time.perf_counter()
        result = train(cfg, data, out / f"arm_{arm}")
        wall = time.perf_counter() - t0
        model, _ = load_model(result.checkpoint_dir, "cpu")
        if held_set is None:
            vision = model.cfg.vision
            held_set = mixed_heldout_set(data, vision.tokens_per_image if vision is not None else None)
        t1 = time.perf_counter()
        measured = checkpoint_expert_load(model, held_set)
        rows[arm] = {"steps": cfg.steps, "train_wall_s": wall, "heldout_wall_s": time.perf_counter() - t1,
                     **flat_metrics(measured), "by_kind": measured["with_bias"]["by_kind"],
                     **{k: v for k, v in result.eval.items() if k.startswith("moe/") or k == "eval/ppl"},
                     "load_curve": [round(h["moe/load_max_over_mean"], 3) for h in result.history]}
        print(json.dumps({k: v for k, v in rows[arm].items() if k != "load_curve"}), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lineage", type=Path, required=True, help="a K3_HOME with a materialized pretraining lineage")
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--stages", default="1,2,3,4")
    ap.add_argument("--label", default="balance_shift")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--rates", default=None, help="train with these quantile update rates η (comma-separated)")
    ap.add_argument("--train-stages", default="2")
    ap.add_argument("--arms", action="store_true", help="train the balancing_ablation asset's two arms on the "
                    "lineage's data (--steps: per arm, 0: the profile's BALANCING_ARM_STEPS)")
    ap.add_argument("--heldout", action="store_true", help="with --replay-rates: also the held-out mixed set's "
                    "load under the replayed bias")
    ap.add_argument("--replay-rates", default=None, help="replay each of --stages' balancer on its final weights "
                    "with these rates η (comma-separated)")
    ap.add_argument("--steps", type=int, default=0, help="steps per trained stage (0: the profile's)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/balance_shift_runs"))
    ap.add_argument("--out", type=Path, default=Path(ROOT) / "benchmarks" / "results" / "recipes",
                    help="folder of the result JSON")
    args = ap.parse_args()
    torch.manual_seed(0)
    data = lineage_data(args.lineage, args.profile)
    if args.arms:
        runs = arms_run(data, args.profile, args.work, args.steps or None)
        out = args.out / f"{run_header()['date'][:10]}_{args.label}_{args.profile}.json"
        write_json(out, {"header": run_header(args.commit), "lineage": str(args.lineage), "profile": args.profile,
                         "mode": "arms", "arms": runs})
        print(out)
        return
    if args.replay_rates:
        runs = [replay(args.lineage, args.profile, st, float(r), data, args.heldout)
                for st in (int(x) for x in args.stages.split(",")) for r in args.replay_rates.split(",")]
        out = args.out / f"{run_header()['date'][:10]}_{args.label}_{args.profile}.json"
        write_json(out, {"header": run_header(args.commit), "lineage": str(args.lineage), "profile": args.profile,
                         "mode": "replay", "runs": runs})
        print(out)
        return
    if args.rates:
        runs = [rate_run(data, args.lineage, args.profile, s, float(r), args.steps, args.work)
                for s in (int(x) for x in args.train_stages.split(","))
                for r in args.rates.split(",")]
        out = args.out / f"{run_header()['date'][:10]}_{args.label}_{args.profile}.json"
        write_json(out, {"header": run_header(args.commit), "lineage": str(args.lineage), "profile": args.profile,
                         "steps": args.steps, "runs": runs})
        print(out)
        return
    sets: dict = {}
    results = []
    for s in (int(x) for x in args.stages.split(",")):
        runs = sorted((args.lineage / "checkpoints" / args.profile / f"pretrain_stage_{s}").glob("*/manifest.json"),
                      key=lambda p: p.stat().st_mtime)
        results.append(stage_figures(runs[-1].parent, data, sets))
    out = args.out / f"{run_header()['date'][:10]}_{args.label}_{args.profile}.json"
    write_json(out, {"header": run_header(args.commit), "lineage": str(args.lineage), "profile": args.profile,
                     "stages": results})
    print(out)


if __name__ == "__main__":
    main()
