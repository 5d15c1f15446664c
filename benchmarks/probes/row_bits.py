"""Does a row's result depend on how many rows share the call? (issue 20: an exact verify on CUDA)

A speculative verify feeds K + 1 tokens through the model's matmuls at once; the plain decode step
feeds one token (one row per sequence). On the CPU, F.linear gives a row the same bits for any M ≥ 4
(docs/log/engine.md), which is what `engine.MIN_ROWS` builds on. This probe asks the same of CUDA:
for each op and M, is row 0 of a call over M rows bitwise row 0 of the call over 1 row, and of the
call over `--ref-rows` rows? Ops at the small profile's decode shapes: F.linear (d_model → several
widths), `torch._grouped_mm` over 32 experts' row ranges, and SDPA with one query against the same
query among K + 1 causal queries over the same cached keys.

    python benchmarks/probes/row_bits.py --out OUT.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from benchmarks.common import run_header

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 64)
WIDTHS = ((1024, 1024), (1024, 512), (1024, 3072), (512, 384), (384, 512), (1024, 16384))


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a, b))


def linear_rows(dtype, device, ref_rows: int) -> list[dict]:
    out = []
    for k, n in WIDTHS:
        w = torch.randn(n, k, device=device, dtype=dtype) / k ** 0.5
        x = torch.randn(max(ROWS), k, device=device, dtype=dtype)
        one, ref = F.linear(x[:1], w), F.linear(x[:ref_rows], w)
        out.append({"op": f"linear {k}->{n}", "dtype": str(dtype),
                    "row0_equals_M1": {m: same(F.linear(x[:m], w)[:1], one) for m in ROWS},
                    f"row0_equals_M{ref_rows}": {m: same(F.linear(x[:m], w)[:1], ref[:1]) for m in ROWS}})
    return out


def grouped_rows(device) -> list[dict]:
    """32 experts, latent 512 → hidden 384, bf16 (the op takes bf16 on CUDA): the first expert's first
    row, with that expert's row count m and every other expert at 0 or 1 rows."""
    E, L, H = 32, 512, 384
    w = (torch.randn(E, H, L, device=device) / L ** 0.5).to(torch.bfloat16)
    x = torch.randn(max(ROWS) * E, L, device=device).to(torch.bfloat16)
    out = {}
    for others in (0, 1):
        res = {}
        for m in ROWS:
            counts = torch.full((E,), others, device=device, dtype=torch.int32)
            counts[0] = m
            offs = counts.cumsum(0).to(torch.int32)
            rows = int(offs[-1])
            y = torch._grouped_mm(x[:rows], w.transpose(-2, -1), offs=offs)
            res[m] = y[:1]
        out[f"others_{others}"] = {m: same(res[m], res[1]) for m in ROWS}
    return [{"op": "_grouped_mm 512->384, 32 experts", "dtype": "torch.bfloat16", "row0_equals_M1": out}]


def sdpa_rows(dtype, device) -> list[dict]:
    """One query over n cached keys against the first of K + 1 queries (causal among the new ones) over
    the same n keys plus the K new ones, which that first query must not see."""
    B, Hh, D, n = 1, 16, 96, 512
    out = []
    for K in (1, 3, 5):
        q = torch.randn(B, Hh, K + 1, D, device=device, dtype=dtype)
        kv = torch.randn(2, B, Hh, n + K + 1, D, device=device, dtype=dtype)
        k, v = kv[0], kv[1]
        one = F.scaled_dot_product_attention(q[:, :, :1], k[:, :, : n + 1], v[:, :, : n + 1])
        mask = torch.ones(K + 1, n + K + 1, dtype=torch.bool, device=device).tril(n)
        many = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out.append({"op": f"sdpa 1 query vs {K + 1} causal queries over {n} keys", "dtype": str(dtype),
                    "row0_equal": same(many[:, :, :1], one),
                    "max_abs_diff": (many[:, :, :1].float() - one.float()).abs().max().item()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref-rows", type=int, default=5, help="the verify's rows at draft length 4")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    result = {"probe": "row_bits", "header": run_header(), "device": device, "rows": []}
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in (torch.float32, torch.bfloat16):
        result["rows"] += linear_rows(dtype, device, args.ref_rows)
        result["rows"] += sdpa_rows(dtype, device)
    if device == "cuda":
        result["rows"] += grouped_rows(device)
    for row in result["rows"]:
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
