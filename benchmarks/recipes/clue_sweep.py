"""Which training recipe lets a profile's model learn the scattered-clue task? A sweep of clue probes.

`benchmarks/recipes/clue_probe.py` trains one recipe on the CPU; this script runs many at once on a GPU,
where the machines have only torch and numpy. So it works in two steps:

    # 1. On the CPU (needs the data assets: tokenizer, corpus, clue_data): pack training rows and a
    #    held-out eval set into one .npz (clue rows at each length, plain text rows, eval rows).
    python benchmarks/recipes/clue_sweep.py pack --data-home /work/base-home --profile tiny \\
        --lengths 64,512 --out /tmp/clue_rows.npz
    # 2. Anywhere (torch + numpy only): train every recipe of a JSON list, each in its own process
    #    (`--jobs` at a time), scoring the eval rows every `eval_every` steps.
    python benchmarks/recipes/clue_sweep.py run --rows /tmp/clue_rows.npz --recipes recipes.json \\
        --jobs 8 --out sweep.json
    # 3. Score saved checkpoints (a pipeline stage's) on the same eval rows.
    python benchmarks/recipes/clue_sweep.py score --rows /tmp/clue_rows.npz --checkpoint DIR --out score.json

A recipe: {"name", "lr", "stages": [{"seq_len", "steps", "batch_size", "clue_fraction"}, ...],
"answer_only": bool (clue rows: loss on the answer only), "answer_mean": bool (the answer
targets' mean loss added to the rest's, `K3Model.compute_loss(answer_mask_BT=)`), "rows" (another .npz), "model": {ModelConfig overrides}, "eval_every", "time_limit_s"}; each stage
draws clue rows of its length with probability clue_fraction and text rows otherwise, cycling
through the packed pools; the learning rate warms up over the first 10 % of all steps and decays by
a cosine to 0.1× (`k3model.schedule.lr_at`), as in the pipeline.

Scoring is the pipeline's (`k3model.train.pretrain_eval.answer_is_argmax`), batched: an example is
correct when the argmax at every answer position (the answer's tokens and <|eos|>) is the answer's
token. Also reported, as a diagnostic only: the fraction of the answer's value tokens that are right.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import ROOT, newest_data, run_header


# ---------------------------------------------------------------------------------------------------
# pack (CPU, needs the data assets)
# ---------------------------------------------------------------------------------------------------

def pack(args) -> None:
    from datagen.clues import build_filler, clue_eval_set, clue_training_examples, eval_cells
    from datagen.packing import PackingConfig, pack_pretraining

    data = newest_data(Path(args.data_home), args.profile)
    tok, cfg = data.tokenizer, replace(data.clues, **json.loads(args.clue_overrides))
    lengths = [int(x) for x in args.lengths.split(",")]
    train_filler = build_filler(data.corpus, tok, "train")
    heldout_filler = build_filler(data.corpus, tok, "heldout")
    out: dict[str, np.ndarray] = {}
    t0 = time.perf_counter()
    for length in lengths:
        n = max(args.clue_tokens // length, 64)
        examples = clue_training_examples(cfg, length, n, tokenizer=tok, filler=train_filler, stream=7)
        out[f"clue_{length}"] = np.stack([e.input_ids for e in examples]).astype(np.int16)
        out[f"clue_{length}_answer"] = np.array([[e.answer_start, e.answer_end] for e in examples], np.int32)
        n_text = max(args.text_tokens // length, 64)
        text = pack_pretraining(PackingConfig(seed=3, clue_fraction=0.0, image_fraction=0.0), cfg, length,
                                n_text, tokenizer=tok, corpus=data.corpus, images=data.images)
        out[f"text_{length}"] = np.stack(text.column("input_ids").to_numpy(zero_copy_only=False)).astype(np.int16)
        ecfg = replace(cfg, eval_per_cell=args.eval_pairs)
        rows, meta = [], []
        for cell_len, b in eval_cells(ecfg):
            if cell_len != length:
                continue
            table = clue_eval_set(ecfg, length, b, tokenizer=tok, filler=heldout_filler)
            for r in table.to_pylist():
                rows.append(r["prompt_ids"] + r["answer_ids"])
                meta.append([len(r["prompt_ids"]), len(r["answer_ids"]), r["bucket_lo"], r["bucket_hi"],
                             int(r["variant"] == "control"), r["n_clues"], r["distance"]])
        out[f"eval_{length}"] = np.array(rows, np.int16)
        out[f"eval_{length}_meta"] = np.array(meta, np.int32)
        print(f"length {length}: {n} clue rows, {n_text} text rows, {len(rows)} eval rows "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    out["value_token_ids"] = np.array([tok.token_to_id(str(d)) for d in range(10)], np.int32)
    np.savez_compressed(args.out, **out)
    print(f"wrote {args.out}")


# ---------------------------------------------------------------------------------------------------
# run (torch + numpy only)
# ---------------------------------------------------------------------------------------------------

@torch.no_grad()
def score(model, ids_NT: np.ndarray, meta: np.ndarray, value_ids: np.ndarray, device: str,
          batch_size: int = 64) -> dict[str, float]:
    """Accuracy by (variant, distance bucket), the pipeline's all-answer-tokens argmax rule."""
    from k3model.train.common import autocast_for
    model.eval()
    ok, val_ok, val_n = [], [], []
    for lo in range(0, len(ids_NT), batch_size):
        ids = torch.from_numpy(ids_NT[lo:lo + batch_size].astype(np.int64)).to(device)
        with autocast_for(device):
            pred = model(ids).logits_BTV.argmax(-1).cpu().numpy()
        for j, row in enumerate(range(lo, lo + len(ids))):
            p_len, a_len = meta[row, 0], meta[row, 1]
            target = ids_NT[row, p_len:p_len + a_len]
            guess = pred[j, p_len - 1:p_len - 1 + a_len]
            ok.append(bool((guess == target).all()))
            is_val = np.isin(target, value_ids)
            val_ok.append(int((guess == target)[is_val].sum()))
            val_n.append(int(is_val.sum()))
    model.train()
    ok, val_ok, val_n = np.array(ok), np.array(val_ok), np.array(val_n)
    res = {}
    for variant, v in (("scattered", 0), ("control", 1)):
        sel = meta[:, 4] == v
        res[f"{variant}/all"] = float(ok[sel].mean())
        res[f"{variant}/value_tokens"] = float(val_ok[sel].sum() / max(val_n[sel].sum(), 1))
        for b_lo, b_hi in sorted({(int(a), int(b)) for a, b in meta[:, 2:4]}):
            cell = sel & (meta[:, 2] == b_lo)
            res[f"{variant}/d{b_lo}-{b_hi}"] = float(ok[cell].mean())
    res["n_pairs"] = int((meta[:, 4] == 1).sum())
    return res


def train_recipe(recipe: dict, rows_path: str, device: str) -> dict:
    from k3model.config import get_profile
    from k3model.model import IGNORE_INDEX, K3Model
    from k3model.schedule import lr_at
    from k3model.train.common import autocast_for, balance_experts, build_optimizer, optimizer_step

    with np.load(recipe.get("rows", rows_path)) as npz:
        rows = dict(npz)  # an NpzFile decompresses an array on every access
    value_ids = rows["value_token_ids"]
    torch.manual_seed(recipe.get("seed", 0))
    rng = np.random.default_rng(recipe.get("seed", 0))
    model_cfg = replace(get_profile(recipe.get("profile", "tiny")).model, **recipe.get("model", {}))
    model = K3Model(model_cfg).to(device)
    optimizer = build_optimizer(model, recipe["lr"], recipe.get("weight_decay", 0.1))
    stages = recipe["stages"]
    total = sum(s["steps"] for s in stages)
    warmup = max(int(0.1 * total), 1)
    eval_lengths = recipe.get("eval_lengths", sorted({s["seq_len"] for s in stages} | {512}))
    eval_sets = {L: (rows[f"eval_{L}"], rows[f"eval_{L}_meta"]) for L in eval_lengths if f"eval_{L}" in rows}
    cursors: dict[str, int] = {}
    result = {"recipe": recipe, "evals": [], "losses": [], "params": sum(p.numel() for p in model.parameters())}
    t0, step, deadline = time.perf_counter(), 0, time.perf_counter() + recipe.get("time_limit_s", 1e9)
    eval_every = recipe.get("eval_every", 250)

    def evaluate(stage_len):
        row = {"step": step, "seq_len": stage_len, "wall_s": round(time.perf_counter() - t0, 1)}
        for L, (ids, meta) in eval_sets.items():
            row.update({f"len{L}/{k}": v for k, v in score(model, ids, meta, value_ids, device).items()})
        result["evals"].append(row)
        print(json.dumps({"name": recipe["name"], **{k: v for k, v in row.items()
                                                       if "/d" not in k}}), flush=True)

    def take(pool: str, n: int) -> np.ndarray:
        data = rows[pool]
        c = cursors.get(pool, int(rng.integers(len(data))))
        idx = (c + np.arange(n)) % len(data)
        cursors[pool] = int((c + n) % len(data))
        return idx

    stopped = False
    for stage in stages:
        L, B = stage["seq_len"], stage["batch_size"]
        for _ in range(stage["steps"]):
            if time.perf_counter() > deadline:
                stopped = True
                break
            n_clue = int(rng.binomial(B, stage.get("clue_fraction", 1.0)))
            clue_idx = take(f"clue_{L}", n_clue)
            text_idx = take(f"text_{L}", B - n_clue)
            ids_np = np.concatenate([rows[f"clue_{L}"][clue_idx], rows[f"text_{L}"][text_idx]]).astype(np.int64)
            ids = torch.from_numpy(ids_np).to(device)
            labels = torch.full_like(ids, IGNORE_INDEX)
            labels[:, :-1] = ids[:, 1:]
            answer_mask = None
            if recipe.get("answer_only") or recipe.get("answer_mean"):
                answer_mask = torch.zeros_like(ids, dtype=torch.bool)
                for r, a0 in enumerate(rows[f"clue_{L}_answer"][clue_idx, 0]):
                    answer_mask[r, a0 - 1:] = True  # the answer and <|eos|>, read from answer_start − 1 on
                    if recipe.get("answer_only"):
                        labels[r, :a0 - 1] = IGNORE_INDEX  # clue rows: loss only on the answer
                if not recipe.get("answer_mean"):
                    answer_mask = None
            lr = lr_at(step, total, recipe["lr"], warmup, 0.1)
            for group in optimizer.param_groups:
                group["lr"] = lr
            model.train()
            with autocast_for(device):
                losses = model.compute_loss(ids, labels, answer_mask_BT=answer_mask)
            optimizer_step(model, optimizer, losses["loss/total"], 1.0)
            balance_experts(model)
            step += 1
            if step % 25 == 0:
                result["losses"].append([step, round(float(losses["loss/main"].detach()), 4)])
            if step % eval_every == 0:
                evaluate(L)
        if stopped:
            break
    if not result["evals"] or result["evals"][-1]["step"] != step:
        evaluate(stages[-1]["seq_len"])
    result["steps_done"], result["wall_s"] = step, time.perf_counter() - t0
    result["stopped_by_time_limit"] = stopped
    return result


def run(args) -> None:
    recipes = json.loads(Path(args.recipes).read_text())
    # Logs and per-recipe parts stay out of the result's folder (a device call brings back few files).
    out_dir = Path(args.work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    procs, results, pending = [], [], list(recipes)
    header = run_header()
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    while pending or procs:
        while pending and len(procs) < args.jobs:
            recipe = pending.pop(0)
            part = out_dir / f".part_{recipe['name']}.json"
            log = open(out_dir / f".log_{recipe['name']}.txt", "w")
            p = subprocess.Popen([sys.executable, __file__, "one", "--rows", args.rows, "--recipe",
                                  json.dumps(recipe), "--out", str(part)], env=env, stdout=log,
                                 stderr=subprocess.STDOUT)
            procs.append((p, recipe, part, log))
        time.sleep(2)
        for item in list(procs):
            p, recipe, part, log = item
            if p.poll() is None:
                continue
            procs.remove(item)
            log.close()
            text = (out_dir / f".log_{recipe['name']}.txt").read_text()
            if p.returncode == 0 and part.exists():
                results.append(json.loads(part.read_text()))
            else:
                results.append({"recipe": recipe, "error": text[-3000:], "returncode": p.returncode})
            print(text[-1500:], flush=True)
            Path(args.out).write_text(json.dumps({"header": header, "results": results, "device": device_name(),
                                                  "wall_s": time.perf_counter() - t0}, indent=1))
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def one(args) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = train_recipe(json.loads(args.recipe), args.rows, device)
    result["device"] = device_name()
    Path(args.out).write_text(json.dumps(result))


def score_checkpoint(args) -> None:
    """Score saved checkpoints (e.g. a pipeline stage's) on the packed eval rows."""
    from k3model.checkpoint import load_model
    with np.load(args.rows) as npz:
        rows = dict(npz)
    out = {"rows": args.rows, "checkpoints": []}
    for path in args.checkpoint:
        model, manifest = load_model(path)
        row = {"checkpoint": path, "step": manifest.get("step")}
        for L in [int(k[5:]) for k in rows if k.startswith("eval_") and not k.endswith("_meta")]:
            row.update({f"len{L}/{k}": v for k, v in score(model, rows[f"eval_{L}"], rows[f"eval_{L}_meta"],
                                                           rows["value_token_ids"], "cpu").items()})
        out["checkpoints"].append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--data-home", required=True)
    p.add_argument("--profile", default="tiny")
    p.add_argument("--lengths", default="64,512")
    p.add_argument("--clue-tokens", type=int, default=2_000_000, help="clue tokens per length in the pool")
    p.add_argument("--text-tokens", type=int, default=1_000_000, help="text tokens per length in the pool")
    p.add_argument("--eval-pairs", type=int, default=48, help="(scattered, control) pairs per distance bucket")
    p.add_argument("--clue-overrides", default="{}", help='CluesConfig fields as JSON, e.g. {"compact_statements": true}')
    p.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--rows", required=True)
    r.add_argument("--recipes", required=True)
    r.add_argument("--jobs", type=int, default=8)
    r.add_argument("--work-dir", default="/tmp/clue_sweep")
    r.add_argument("--out", required=True)
    o = sub.add_parser("one")
    o.add_argument("--rows", required=True)
    o.add_argument("--recipe", required=True)
    o.add_argument("--out", required=True)
    c = sub.add_parser("score")
    c.add_argument("--rows", required=True)
    c.add_argument("--checkpoint", action="append", required=True)
    c.add_argument("--out", required=True)
    args = parser.parse_args()
    {"pack": pack, "run": run, "one": one, "score": score_checkpoint}[args.cmd](args)


if __name__ == "__main__":
    main()
