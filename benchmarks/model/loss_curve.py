"""A fixed-seed training run's loss curve, to show that a speed change left the model's mathematics alone.

    python benchmarks/model/loss_curve.py --out benchmarks/results/train/loss_curve_tiny_cpu.json          # record
    python benchmarks/model/loss_curve.py --compare benchmarks/results/train/loss_curve_tiny_cpu.json      # check

Trains the profile's full model (MTP and the vision encoder included) for `--steps` steps with the
pipeline's own `train_step` and `build_optimizer` (AdamW, clipping, balancing-bias updates) on
synthetic batches that are a pure function of the seed: token rows from a fixed random bigram chain
(so the loss falls and the gradients are not noise), a quarter of the rows opening with an image and
its <|image|> slots. `--compare` recomputes the curve and fails (exit 1) unless every step's losses
(main, MTP, total) and grad norms lie within `--rtol` of the recorded ones, and writes the side by
side. Two fp32 runs of an unchanged model on one machine agree to ~1e-6; a changed model or a changed
data path differs at the first steps by far more.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import run_header
from k3model.config import get_profile
from k3model.model import IGNORE_INDEX, K3Model
from k3model.train.pretrain import build_optimizer, train_step
from k3model.train.pretrain_data import Batch

KEYS = ("train/main", "train/mtp_1", "train/total", "train/grad_norm")


def synthetic_batches(profile: str, steps: int, batch_size: int, seq_len: int, seed: int) -> list[Batch]:
    cfg = get_profile(profile).model
    gen = torch.Generator().manual_seed(seed)
    V = cfg.vocab_size
    # Each token has 4 possible successors among 256 tokens: a next-token distribution 50 steps can learn.
    successors_V4 = torch.randint(0, min(V, 256), (V, 4), generator=gen)
    batches = []
    for _ in range(steps):
        ids_BT = torch.empty(batch_size, seq_len, dtype=torch.long)
        ids_BT[:, 0] = torch.randint(0, V, (batch_size,), generator=gen)
        pick_BT = torch.randint(0, 4, (batch_size, seq_len), generator=gen)
        for t in range(1, seq_len):
            ids_BT[:, t] = successors_V4[ids_BT[:, t - 1], pick_BT[:, t]]
        labels_BT = torch.full_like(ids_BT, IGNORE_INDEX)
        labels_BT[:, :-1] = ids_BT[:, 1:]
        images, mask = None, None
        if cfg.vision is not None:
            n_img, P = max(batch_size // 4, 1), cfg.vision.tokens_per_image
            mask = torch.zeros(batch_size, seq_len, dtype=torch.bool)
            mask[:n_img, 1:1 + P] = True
            images = torch.rand(n_img, cfg.vision.channels, cfg.vision.image_size, cfg.vision.image_size,
                                generator=gen)
            labels_BT[:n_img, :1 + P] = IGNORE_INDEX  # slots are never targets, nor is the token before
        batches.append(Batch(ids_BT, labels_BT, images, mask))
    return batches


def run_curve(profile: str, steps: int, batch_size: int, seq_len: int, seed: int, lr: float,
              perturb: float = 0.0) -> list[dict]:
    torch.manual_seed(seed)
    model = K3Model(get_profile(profile).model)
    if perturb:
        # w ← w·(1 + ε·N(0, 1)): the float-noise yardstick (see the module docstring).
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + perturb * torch.randn(p.shape, generator=gen))
    optimizer = build_optimizer(model, lr, 0.1)
    rows = []
    for step, batch in enumerate(synthetic_batches(profile, steps, batch_size, seq_len, seed)):
        metrics = train_step(model, optimizer, batch, 1.0, "cpu")
        rows.append({k: metrics[k] for k in KEYS if k in metrics})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--rtol", type=float, default=1e-4, help="tolerance before the curves' paths split")
    ap.add_argument("--exact-steps", type=int, default=2,
                    help="steps that must agree to --rtol; later steps are held to --band's spread")
    ap.add_argument("--perturb", type=float, default=0.0,
                    help="scale every initial weight by 1 + ε·N(0, 1) (with ε ~ 1e-7: the run-to-run float noise)")
    ap.add_argument("--band", default=None,
                    help="a JSON of the reference code run with --perturb and --compare: its spread bounds later steps")
    ap.add_argument("--compare", default=None, help="a JSON this script wrote: check against its curve")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    rows = run_curve(args.profile, args.steps, args.batch_size, args.seq_len, args.seed, args.lr, args.perturb)
    result = {"header": run_header(), "args": vars(args), "wall_s": time.perf_counter() - t0,
              "threads": torch.get_num_threads(), "curve": rows}
    ok = True
    if args.compare:
        ref = json.loads(Path(args.compare).read_text())
        rel = {key: [abs(a[key] - b[key]) / max(abs(b[key]), 1e-12) for a, b in zip(rows, ref["curve"])]
               for key in KEYS if key in ref["curve"][0]}
        worst = {key: max(d) for key, d in rel.items()}
        early = {key: max(d[:args.exact_steps]) for key, d in rel.items()}
        ok = len(rows) == len(ref["curve"]) and all(v <= args.rtol for v in early.values())
        if args.band:
            band = json.loads(Path(args.band).read_text())["max_rel_diff"]
            # Chaotic growth from one flipped routing choice differs from run to run: allow 3× the spread.
            ok = ok and all(worst[k] <= max(3 * band[k], args.rtol) for k in worst)
            result["band_max_rel_diff"] = band
        result.update({"reference": args.compare, "max_rel_diff": worst, "max_rel_diff_first_steps": early,
                       "within_tolerance": ok, "reference_curve": ref["curve"]})
        print(json.dumps({"max_rel_diff_first_steps": early, "max_rel_diff": worst, "ok": ok}))
    print(f"loss {rows[0]['train/main']:.4f} -> {rows[-1]['train/main']:.4f} over {len(rows)} steps "
          f"({result['wall_s']:.1f} s)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
