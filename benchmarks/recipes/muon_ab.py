"""AdamW vs Per-Head Muon on a profile's pretraining stage 1 at equal tokens: held-out loss, clue accuracy
and wall time per step, several seeds, all runs in one process (the time ratio is measured on one machine
under one load; runs are interleaved so load drift hits both optimizers alike).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 10 python benchmarks/recipes/muon_ab.py --steps 200
    python3 benchmarks/recipes/muon_ab.py --profile small --device cuda --steps 40 --seeds 0 1 2 \
        --timing-first --timing-reps 5 --budget-s 540 --out $OUT/muon_ab_small.json    # the GPU call

Each run is `k3model.train.pretrain.train` with `optimizer` the only difference: the profile's stage-1
shape (tiny 32 × 64 tokens, small 64 × 512), its peak lr, one warmup + cosine over `--steps` (the clue
warmup is off, so the reduced run sees the stage's mixed rows from its first step), MoE balancing as the
profile sets it; on CUDA whatever `train` does there (bf16 autocast; small's stage 1 keeps activation
checkpointing on a GPU under 100 GiB). Muon's update RMS is matched to AdamW's (0.2), so both run at
the same lr. Held-out figures are the stage's own end-of-stage evaluation (pretrain_eval.evaluate:
perplexity over `--ppl-windows` 512-token held-out windows, clue accuracy at the stage's length) plus
`heldout_nll_stage`, the held-out NLL over 8 × `--ppl-windows` windows of the stage's own length (64 at
tiny: the 2026-12-05 JSON calls it `heldout_nll_64`). Wall time per step is the loop's own (MetricBuffer
windows: step time only, read after the device finishes), and, less exposed to a shared machine's load
drift, the median of `--timing-reps` whole steps timed with the two optimizers alternating step by step
(`--timing-only` runs just that; on CUDA each timed span starts and ends with a synchronisation).

The data are the profile's datagen preset, built into `--data` if missing: only the four files the
loop reads (`datagen.build.PRETRAIN_INPUTS`; small's packed stage tables, 2^26 tokens, are skipped).
With `--budget-s` a seed's pair of runs is skipped when the first pair's wall time says it would end
past the budget (the GPU call's 10 minutes); the JSON is rewritten after every run, so a call cut
short still returns the runs it finished.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, run_header, write_json
from datagen.profiles import PROFILES as DATA_PROFILES
from k3model.checkpoint import load_model
from k3model.config import get_profile
from k3model.params import count_params
from k3model.train.pretrain import PretrainConfig, train
from k3model.train.pretrain_data import PretrainData
from k3model.train.pretrain_eval import heldout_perplexity


def profile_data(profile: str, directory: Path) -> PretrainData:
    import datagen
    from datagen.build import build_all
    cfg = datagen.presets(profile)
    if not (directory / "clue_eval.parquet").exists():
        started = time.perf_counter()
        build_all(cfg, directory, pretrain_inputs_only=True)
        print(f"built {profile}'s pretraining data in {time.perf_counter() - started:.1f} s → {directory}", flush=True)
    return PretrainData(directory / "tokenizer.json", directory / "corpus.parquet", directory / "images.parquet",
                        directory / "clue_eval.parquet", clues=cfg.clues)


def check_device(profile: str, device: str) -> None:
    """ValueError for a device this run cannot honour: `train` picks CUDA whenever torch sees it."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device here (torch.cuda.is_available() is "
                         "False): run it on the GPU machine, or pass --device cpu")
    if device == "cpu" and torch.cuda.is_available():
        raise ValueError("--device cpu, but this machine has a GPU and pretrain.train trains on CUDA whenever "
                         "it can: pass --device cuda, or hide the GPU (CUDA_VISIBLE_DEVICES=) for a CPU run")
    if device == "cpu" and get_profile(profile).device == "cuda":
        stage = get_profile(profile).stages[0]
        raise ValueError(f"--profile {profile} is sized for one GPU: its stage-1 step is {stage.batch_size} × "
                         f"{stage.seq_len} tokens of a {count_params(profile)['total'] / 1e6:.0f}M-parameter model, "
                         f"many minutes on a CPU; pass --device cuda on the GPU machine")


def stage_shape(profile: str) -> dict:
    """The stage-1 shape this machine trains (what `train` resolves it to here)."""
    stage = PretrainConfig(profile=profile, stage=1).resolved()
    return {"seq_len": stage.seq_len, "batch_size": stage.batch_size, "lr": stage.lr, "device": stage.device,
            "activation_checkpointing": stage.model.activation_checkpointing, "notes": list(stage.notes)}


def release(device: str) -> None:
    """Hand cached GPU memory back between runs: each run builds its own model and optimizer."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def one_run(data: PretrainData, optimizer: str, seed: int, steps: int, out: Path, args) -> dict:
    seq_len = get_profile(args.profile).stages[0].seq_len
    cfg = PretrainConfig(profile=args.profile, stage=1, seed=seed, steps=steps, optimizer=optimizer,
                         clue_warmup_steps=0, mixed_lr=0, ckpt_every=steps, log_every=steps,
                         eval_examples_per_cell=args.pairs_per_cell, eval_max_length=seq_len,
                         eval_ppl_windows=args.ppl_windows, eval_vqa_questions=16)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = train(cfg, data, out / f"{optimizer}_s{seed}")
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    release(args.device)
    model, _ = load_model(result.checkpoint_dir, args.device)
    model.eval()
    # As the stage's own evaluation measures (no autocast: fp32 on either device).
    ppl_stage = heldout_perplexity(model, data, args.device, length=seq_len, windows=args.ppl_windows * 8)
    del model
    release(args.device)
    hist = result.history
    tokens_per_step = result.tokens_seen / steps
    row = {
        "optimizer": optimizer, "seed": seed, "steps": steps, "tokens": result.tokens_seen,
        "heldout_nll_stage": math.log(ppl_stage), "stage_seq_len": seq_len,
        "heldout_ppl_512": result.eval["eval/ppl"], "heldout_nll_512": math.log(result.eval["eval/ppl"]),
        f"clue_acc_{seq_len}": {k.split("/", 2)[2]: v for k, v in result.eval.items()
                                if k.startswith("eval/clue_acc/")},
        "train_loss_last10pct": result.eval["train/final_loss"],
        "train_loss_first": result.eval["train/first_loss"],
        "s_per_step": tokens_per_step / result.eval["perf/tokens_per_s"],
        "wall_s_with_eval": time.perf_counter() - started,
        "peak_gpu_gib": peak_gib,
        "max_attn_logit": max(h.get("attn/max_logit", float("nan")) for h in hist),
        "max_attn_logit_last": hist[-1].get("attn/max_logit"),
        "moe_load_max_over_mean_last10pct": result.eval.get("moe/load_max_over_mean"),
        "loss_curve": [(h["step"], h["train/main"]) for h in hist[:: max(len(hist) // 20, 1)]],
    }
    print(json.dumps({k: v for k, v in row.items() if k != "loss_curve"}), flush=True)
    return row


def time_steps(data: PretrainData, profile: str, device: str, reps: int, warmup: int = 3) -> dict:
    """Wall time of one whole training step (forward, backward, clip, optimizer, balancing, logit
    monitor) per optimizer, the two alternating step by step on the stage-1 batch shape so that load
    drift on a shared machine hits both alike; medians and the optimizer.step() share. On CUDA the
    device is synchronised at both ends of each timed span (the optimizer step's too), and the two
    models live on the GPU together: an out-of-memory there is recorded, not raised."""
    from k3model.model import K3Model
    from k3model.train.pretrain import step_metrics
    from k3model.train.pretrain_data import StageBatches
    from k3model.train.common import build_optimizer, track_max_logits

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    cfg = PretrainConfig(profile=profile, stage=1, clue_warmup_steps=0)
    stage = cfg.resolved()
    batches = StageBatches(data, stage.model, seq_len=stage.seq_len, batch_size=stage.batch_size, seed=0, stage=1,
                           clue_fraction=cfg.clue_fraction, image_fraction=cfg.image_fraction, device=device,
                           clue_warmup_rows=0)
    batches.pack((warmup + reps) * stage.batch_size)

    def build(name: str) -> dict:
        torch.manual_seed(0)
        model = K3Model(stage.model).to(device)
        track_max_logits(model)
        opt = build_optimizer(model, stage.lr, 0.1, optimizer=name)
        step_time = []

        def timed_step(orig=opt.step, acc=step_time):
            sync()
            t = time.perf_counter()
            out = orig()
            sync()
            acc.append(time.perf_counter() - t)
            return out
        opt.step = timed_step
        return {"model": model, "opt": opt, "step": [], "opt_step": step_time}

    def alternate(arms: dict) -> None:
        for i in range(warmup + reps):
            batch = batches.batch(i)
            for arm in arms.values():
                sync()
                t = time.perf_counter()
                step_metrics(arm["model"], arm["opt"], batch, 1.0, device)
                sync()
                arm["step"].append(time.perf_counter() - t)
                # Outside the timed span: the resting arm holds no gradients while the other steps.
                arm["opt"].zero_grad(set_to_none=True)

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    arms, oom = {}, None
    try:
        for name in ("adamw", "muon"):
            arms[name] = build(name)
        alternate(arms)
    except torch.OutOfMemoryError as e:
        oom = f"out of memory with both arms on the GPU after {[len(a['step']) for a in arms.values()]} " \
              f"steps: {str(e).splitlines()[0]}"
    if oom is not None:
        arms.clear()
        release(device)
        return {"error": oom, "reps": reps}
    out = {name: {"median_step_s": statistics.median(arm["step"][warmup:]),
                  "median_optimizer_step_s": statistics.median(arm["opt_step"][warmup:]),
                  "steps_s": arm["step"][warmup:], "warmup_steps_s": arm["step"][:warmup]}
           for name, arm in arms.items()}
    out["muon_over_adamw_median_step"] = out["muon"]["median_step_s"] / out["adamw"]["median_step_s"]
    out["reps"] = reps
    if device == "cuda":
        out["peak_gpu_gib_both_arms"] = torch.cuda.max_memory_allocated() / 2**30
    arms.clear()
    release(device)
    return out


def summarize(rows: list[dict], seeds: list[int]) -> dict:
    def mean(opt, key):
        return statistics.mean(r[key] for r in rows if r["optimizer"] == opt)

    summary = {opt: {k: mean(opt, k) for k in ("heldout_nll_stage", "heldout_nll_512", "train_loss_last10pct",
                                                 "s_per_step", "max_attn_logit")} for opt in ("adamw", "muon")}
    summary["seeds"] = seeds
    summary["muon_minus_adamw_heldout_nll_stage_per_seed"] = [
        next(r for r in rows if r["optimizer"] == "muon" and r["seed"] == s)["heldout_nll_stage"]
        - next(r for r in rows if r["optimizer"] == "adamw" and r["seed"] == s)["heldout_nll_stage"]
        for s in seeds]
    summary["muon_over_adamw_s_per_step"] = summary["muon"]["s_per_step"] / summary["adamw"]["s_per_step"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny", choices=DATA_PROFILES,
                        help="whose stage 1 (its shape, lr, model and data preset)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="must be the device pretrain.train picks here (CUDA whenever torch sees it)")
    parser.add_argument("--data", default=None, help="the profile's data directory (built if missing; default "
                        "/tmp/muon_ab/data for tiny, /tmp/muon_ab/data_<profile> otherwise)")
    parser.add_argument("--work", default=None, help="checkpoints (default /tmp/muon_ab/runs[_<profile>])")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--optimizers", nargs="+", choices=("adamw", "muon"), default=["adamw", "muon"])
    parser.add_argument("--pairs-per-cell", type=int, default=16)
    parser.add_argument("--ppl-windows", type=int, default=8)
    parser.add_argument("--out", default=None)
    parser.add_argument("--commit", default=None, help="the tree's commit (the GPU machine's copy has no .git)")
    parser.add_argument("--timing-reps", type=int, default=20,
                        help="interleaved whole-step timings per optimizer after the runs (0: none)")
    parser.add_argument("--timing-first", action="store_true",
                        help="the interleaved timing before the runs (on a GPU its warm-up steps also take "
                             "the kernels' first compiles out of the first run's step time)")
    parser.add_argument("--timing-only", action="store_true", help="only the interleaved step timing")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip a seed's pair of runs that the first pair's wall time says would end after "
                             "this many seconds from the start (the first pair always runs)")
    args = parser.parse_args()
    for name in ("steps", "timing_reps", "pairs_per_cell", "ppl_windows"):
        if getattr(args, name) < (0 if name == "timing_reps" else 1):
            parser.error(f"--{name.replace('_', '-')} must be ≥ {0 if name == 'timing_reps' else 1}")
    if args.timing_only and not args.timing_reps:
        parser.error("--timing-only needs --timing-reps ≥ 1")
    try:
        check_device(args.profile, args.device)
    except ValueError as e:
        parser.error(str(e))
    started = time.perf_counter()
    if args.device == "cpu":
        torch.set_num_threads(1)
    suffix = "" if args.profile == "tiny" else f"_{args.profile}"
    data = profile_data(args.profile, Path(args.data or f"/tmp/muon_ab/data{suffix}"))
    work = Path(args.work or f"/tmp/muon_ab/runs{suffix}")
    results = Path(ROOT) / "benchmarks" / "results" / "recipes"
    date = time.strftime("%Y-%m-%d")
    base = {"header": run_header(args.commit), "args": vars(args), "stage": stage_shape(args.profile)}
    if args.timing_only:
        timing = time_steps(data, args.profile, args.device, args.timing_reps)
        out = args.out or str(results / f"{date}_muon_step_time_{args.profile}_stage1_{args.device}.json")
        write_json(out, base | {"timing": timing})
        print(json.dumps({k: v for k, v in timing.items() if k not in ("adamw", "muon")} |
                         {k: {kk: vv for kk, vv in timing[k].items() if kk not in ("steps_s", "warmup_steps_s")}
                          for k in ("adamw", "muon") if k in timing}))
        return
    both = set(args.optimizers) == {"adamw", "muon"}
    if both:
        out = args.out or str(results / f"{date}_muon_ab_{args.profile}_stage1_{args.device}.json")
    else:
        # One arm alone (e.g. AdamW given the steps Muon's slower step buys at equal wall time).
        out = args.out or str(results / f"{date}_muon_ab_{'_'.join(args.optimizers)}_{args.steps}steps"
                                        f"{suffix}_{args.device}.json")
    report = dict(base, complete=False)
    if both and args.timing_reps and args.timing_first:
        report["timing"] = time_steps(data, args.profile, args.device, args.timing_reps)
        print(json.dumps({"timing": {k: v for k, v in report["timing"].items() if k not in ("adamw", "muon")}}),
              flush=True)
        write_json(out, report)
    rows, seeds_run, pair_s = [], [], None
    for seed in args.seeds:
        elapsed = time.perf_counter() - started
        if args.budget_s is not None and pair_s is not None and elapsed + pair_s > args.budget_s:
            report["skipped_seeds"] = args.seeds[args.seeds.index(seed):]
            print(f"budget: {elapsed:.0f} s gone, a pair takes ~{pair_s:.0f} s, {args.budget_s:.0f} s allowed: "
                  f"seeds {report['skipped_seeds']} skipped", flush=True)
            break
        pair_started = time.perf_counter()
        for optimizer in args.optimizers:
            rows.append(one_run(data, optimizer, seed, args.steps, work, args))
            write_json(out, report | {"runs": rows})
        seeds_run.append(seed)
        pair_s = pair_s or time.perf_counter() - pair_started
    report["runs"] = rows
    if both:
        report["summary"] = summarize(rows, seeds_run)
    if both and args.timing_reps and not args.timing_first:
        report["timing"] = time_steps(data, args.profile, args.device, args.timing_reps)
    if both and "muon_over_adamw_median_step" in report.get("timing", {}):
        report["summary"]["muon_over_adamw_median_step_interleaved"] = report["timing"]["muon_over_adamw_median_step"]
    report["complete"] = True
    report["wall_s"] = time.perf_counter() - started
    write_json(out, report)
    if both:
        print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
