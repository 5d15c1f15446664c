"""AdamW vs Per-Head Muon on tiny pretraining stage 1 at equal tokens: held-out loss, clue accuracy and
wall time per step, two seeds, all runs in one process (the time ratio is measured on one machine
under one load; runs are interleaved so load drift hits both optimizers alike).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 10 python benchmarks/recipes/muon_ab.py --steps 200

Each run is `k3model.train.pretrain.train` with `optimizer` the only difference: the profile's stage-1
shape (32 × 64 tokens), its peak lr, one warmup + cosine over `--steps` (the clue warmup is off, so the
reduced run sees the stage's mixed rows from its first step), MoE balancing as the profile sets it.
Muon's update RMS is matched to AdamW's (0.2), so both run at the same lr. Held-out figures are the
stage's own end-of-stage evaluation (pretrain_eval.evaluate: perplexity over `--ppl-windows` 512-token
held-out windows, clue accuracy at length 64) plus the held-out NLL over 64-token windows of the
stage's own length. Wall time per step is the loop's own (MetricBuffer windows: step time only), and,
less exposed to a shared machine's load drift, the median of `--timing-reps` whole steps timed with the
two optimizers alternating step by step (`--timing-only` runs just that).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, run_header, write_json
from k3model.checkpoint import load_model
from k3model.train.pretrain import PretrainConfig, train
from k3model.train.pretrain_data import PretrainData
from k3model.train.pretrain_eval import heldout_perplexity


def tiny_data(directory: Path) -> PretrainData:
    import datagen
    from datagen.build import build_all
    cfg = datagen.presets("tiny")
    if not (directory / "clue_eval.parquet").exists():
        build_all(cfg, directory)
    return PretrainData(directory / "tokenizer.json", directory / "corpus.parquet", directory / "images.parquet",
                        directory / "clue_eval.parquet", clues=cfg.clues)


def one_run(data: PretrainData, optimizer: str, seed: int, steps: int, out: Path, args) -> dict:
    cfg = PretrainConfig(profile="tiny", stage=1, seed=seed, steps=steps, optimizer=optimizer,
                         clue_warmup_steps=0, mixed_lr=0, ckpt_every=steps, log_every=steps,
                         eval_examples_per_cell=args.pairs_per_cell, eval_max_length=64,
                         eval_ppl_windows=args.ppl_windows, eval_vqa_questions=16)
    started = time.perf_counter()
    result = train(cfg, data, out / f"{optimizer}_s{seed}")
    model, _ = load_model(result.checkpoint_dir)
    model.eval()
    ppl64 = heldout_perplexity(model, data, "cpu", length=64, windows=args.ppl_windows * 8)
    hist = result.history
    tokens_per_step = result.tokens_seen / steps
    row = {
        "optimizer": optimizer, "seed": seed, "steps": steps, "tokens": result.tokens_seen,
        "heldout_nll_64": math.log(ppl64), "heldout_ppl_512": result.eval["eval/ppl"],
        "heldout_nll_512": math.log(result.eval["eval/ppl"]),
        "clue_acc_64": {k.split("/", 2)[2]: v for k, v in result.eval.items() if k.startswith("eval/clue_acc/")},
        "train_loss_last10pct": result.eval["train/final_loss"],
        "train_loss_first": result.eval["train/first_loss"],
        "s_per_step": tokens_per_step / result.eval["perf/tokens_per_s"],
        "wall_s_with_eval": time.perf_counter() - started,
        "max_attn_logit": max(h.get("attn/max_logit", float("nan")) for h in hist),
        "max_attn_logit_last": hist[-1].get("attn/max_logit"),
        "moe_load_max_over_mean_last10pct": result.eval.get("moe/load_max_over_mean"),
        "loss_curve": [(h["step"], h["train/main"]) for h in hist[:: max(len(hist) // 20, 1)]],
    }
    print(json.dumps({k: v for k, v in row.items() if k != "loss_curve"}), flush=True)
    return row


def time_steps(data: PretrainData, reps: int, warmup: int = 3) -> dict:
    """Wall time of one whole training step (forward, backward, clip, optimizer, balancing, logit
    monitor) per optimizer, the two alternating step by step on the stage-1 batch shape so that load
    drift on a shared machine hits both alike; medians and the optimizer.step() share."""
    from k3model.model import K3Model
    from k3model.train.pretrain import step_metrics
    from k3model.train.pretrain_data import StageBatches
    from k3model.train.common import build_optimizer, track_max_logits

    cfg = PretrainConfig(profile="tiny", stage=1, clue_warmup_steps=0)
    stage = cfg.resolved()
    batches = StageBatches(data, stage.model, seq_len=stage.seq_len, batch_size=stage.batch_size, seed=0, stage=1,
                           clue_fraction=cfg.clue_fraction, image_fraction=cfg.image_fraction, device="cpu",
                           clue_warmup_rows=0)
    batches.pack((warmup + reps) * stage.batch_size)
    arms = {}
    for name in ("adamw", "muon"):
        torch.manual_seed(0)
        model = K3Model(stage.model)
        track_max_logits(model)
        opt = build_optimizer(model, stage.lr, 0.1, optimizer=name)
        step_time = []

        def timed_step(orig=opt.step, acc=step_time):
            t = time.perf_counter()
            out = orig()
            acc.append(time.perf_counter() - t)
            return out
        opt.step = timed_step
        arms[name] = {"model": model, "opt": opt, "step": [], "opt_step": step_time}
    for i in range(warmup + reps):
        batch = batches.batch(i)
        for name, arm in arms.items():
            t = time.perf_counter()
            step_metrics(arm["model"], arm["opt"], batch, 1.0, "cpu")
            arm["step"].append(time.perf_counter() - t)
    out = {}
    for name, arm in arms.items():
        steps, opt_steps = arm["step"][warmup:], arm["opt_step"][warmup:]
        out[name] = {"median_step_s": statistics.median(steps), "median_optimizer_step_s": statistics.median(opt_steps),
                     "steps_s": steps}
    out["muon_over_adamw_median_step"] = out["muon"]["median_step_s"] / out["adamw"]["median_step_s"]
    out["reps"] = reps
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/tmp/muon_ab/data", help="tiny data directory (built if missing)")
    parser.add_argument("--work", default="/tmp/muon_ab/runs")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--optimizers", nargs="+", choices=("adamw", "muon"), default=["adamw", "muon"])
    parser.add_argument("--pairs-per-cell", type=int, default=16)
    parser.add_argument("--ppl-windows", type=int, default=8)
    parser.add_argument("--out", default=None)
    parser.add_argument("--timing-reps", type=int, default=20,
                        help="interleaved whole-step timings per optimizer after the runs (0: none)")
    parser.add_argument("--timing-only", action="store_true", help="only the interleaved step timing")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = tiny_data(Path(args.data))
    if args.timing_only:
        timing = time_steps(data, args.timing_reps)
        out = args.out or str(Path(ROOT) / "benchmarks" / "results" / "recipes" /
                              f"{time.strftime('%Y-%m-%d')}_muon_step_time_tiny_stage1_cpu.json")
        write_json(out, {"header": run_header(), "args": vars(args), "timing": timing})
        print(json.dumps({k: v for k, v in timing.items() if k not in ("adamw", "muon")} |
                         {k: {kk: vv for kk, vv in timing[k].items() if kk != "steps_s"} for k in ("adamw", "muon")}))
        return
    rows = []
    for seed in args.seeds:
        for optimizer in args.optimizers:
            rows.append(one_run(data, optimizer, seed, args.steps, Path(args.work), args))
    if set(args.optimizers) != {"adamw", "muon"}:
        # One arm alone (e.g. AdamW given the steps Muon's slower step buys at equal wall time).
        out = args.out or str(Path(ROOT) / "benchmarks" / "results" / "recipes" /
                              f"{time.strftime('%Y-%m-%d')}_muon_ab_{'_'.join(args.optimizers)}_{args.steps}steps_cpu.json")
        write_json(out, {"header": run_header(), "args": vars(args), "runs": rows})
        return

    def mean(opt, key):
        return statistics.mean(r[key] for r in rows if r["optimizer"] == opt)

    summary = {opt: {k: mean(opt, k) for k in ("heldout_nll_64", "heldout_nll_512", "train_loss_last10pct",
                                                 "s_per_step", "max_attn_logit")} for opt in ("adamw", "muon")}
    paired = [next(r for r in rows if r["optimizer"] == "muon" and r["seed"] == s)["heldout_nll_64"]
              - next(r for r in rows if r["optimizer"] == "adamw" and r["seed"] == s)["heldout_nll_64"]
              for s in args.seeds]
    summary["muon_minus_adamw_heldout_nll_64_per_seed"] = paired
    summary["muon_over_adamw_s_per_step"] = summary["muon"]["s_per_step"] / summary["adamw"]["s_per_step"]
    report = {"header": run_header(), "args": vars(args), "summary": summary, "runs": rows}
    if args.timing_reps:
        report["timing"] = time_steps(data, args.timing_reps)
        summary["muon_over_adamw_median_step_interleaved"] = report["timing"]["muon_over_adamw_median_step"]
    out = args.out or str(Path(ROOT) / "benchmarks" / "results" / "recipes" /
                          f"{time.strftime('%Y-%m-%d')}_muon_ab_tiny_stage1_cpu.json")
    write_json(out, report)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
