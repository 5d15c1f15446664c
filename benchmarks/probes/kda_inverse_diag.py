"""Does the UT inverse's method matter on a trained model's own KDA inputs? (docs/log/kda.md)

Loads a tiny-profile checkpoint per stage, runs 2048 held-out tokens through it while recording every
KDA layer's (q, k, v, g, β), and compares the torch chunked output with two inverses of I + A_kk —
the doubling product (I − A)(I + A²)⋯(I + A³²) used before 2026-11-29 (session 2) and the blockwise
substitution `chunk_torch.unit_lower_inverse` — against the float64 recurrence.

    OMP_NUM_THREADS=1 python benchmarks/probes/kda_inverse_diag.py --home .k3 --out benchmarks/results/kda/2026-11-29_inverse_tiny_cpu.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow.parquet as pq
import torch
from tokenizers import Tokenizer

import k3model.kda_layer as kda_layer
import kernels.kda.chunk_torch as chunk_torch
from datagen.corpus import split_texts
from datagen.tokenizer import encode_batch
from k3model.checkpoint import load_model
from kernels.kda.naive import naive_recurrent_kda


def doubling_inverse(A_CC: torch.Tensor) -> torch.Tensor:
    C = A_CC.shape[-1]
    eye = torch.eye(C, dtype=A_CC.dtype, device=A_CC.device)
    inverse, power, span = eye - A_CC, A_CC, 2
    while span < C:
        power = power @ power
        inverse = inverse + inverse @ power
        span *= 2
    return inverse


def newest(home: Path, pattern: str) -> Path:
    found = sorted(home.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"nothing matches {home}/{pattern}: run `k3 run --profile tiny` with K3_HOME={home}")
    return found[-1]


def captured_kda_inputs(model, ids: list[int]) -> list[list[torch.Tensor]]:
    calls, original = [], kda_layer.chunk_kda

    def recording(q, k, v, g, beta, **kwargs):
        calls.append([x.detach().clone() for x in (q, k, v, g, beta)])
        return original(q, k, v, g, beta, **kwargs)

    kda_layer.chunk_kda = recording
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        kda_layer.chunk_kda = original
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", default=".k3", help="a K3_HOME holding tiny checkpoints and data")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--out", required=True, help="e.g. benchmarks/results/kda/<date>_inverse_tiny_cpu.json")
    args = parser.parse_args()
    home = Path(args.home)
    tokenizer = Tokenizer.from_file(str(newest(home, "data/tiny/tokenizer/*/tokenizer.json")))
    corpus = pq.read_table(newest(home, "data/tiny/corpus/*/corpus.parquet"))
    ids = [t for doc in encode_batch(tokenizer, split_texts(corpus, "heldout")) for t in doc][:args.tokens]
    rows = []
    blocked = chunk_torch.unit_lower_inverse
    solve = chunk_torch.unit_lower_solve
    for stage in (1, 2, 3, 4):
        checkpoint = newest(home, f"checkpoints/tiny/pretrain_stage_{stage}/*/manifest.json").parent
        model, _ = load_model(checkpoint)
        model.eval()
        for layer, (q, k, v, g, beta) in enumerate(captured_kda_inputs(model, ids)):
            reference, _ = naive_recurrent_kda(*(x.double() for x in (q, k, v, g, beta)))
            row = {"stage": stage, "kda_call": layer, "checkpoint": str(checkpoint),
                   "k_positive_frac": (k > 0).float().mean().item(), "g_mean": g.mean().item()}
            # chunk_kda_torch solves (I + A) X = rhs with `unit_lower_solve`; each variant stands in
            # for it as inverse(A) @ rhs ("solve" is the triangular solve the CPU path now uses).
            variants = (("doubling", lambda A, r: doubling_inverse(A) @ r),
                        ("substitution", lambda A, r: blocked(A) @ r), ("solve", solve))
            for name, fn in variants:
                chunk_torch.unit_lower_solve = fn
                try:
                    o, _ = chunk_torch.chunk_kda_torch(q, k, v, g, beta)
                finally:
                    chunk_torch.unit_lower_solve = solve
                row[f"rel_err_{name}"] = ((o.double() - reference).norm() / reference.norm()).item()
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(args.out).write_text(json.dumps({"tokens": len(ids), "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
