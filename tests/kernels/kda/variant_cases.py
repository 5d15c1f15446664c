"""The Triton KDA kernel variants (TileConfig) on the CPU under TRITON_INTERPRET=1: one JSON line per
(variant, case), each against the default kernels and the fp32 recurrent reference.

Run as a script in a fresh process, like `interp_cases.py` (whose NaN-poisoned allocations and
inputs it reuses, so scratch a split kernel forgets to write shows up):
    TRITON_INTERPRET=1 python tests/kernels/kda/variant_cases.py
The interpreter computes every dot in fp32 whatever `input_precision` says, so the "tf32" inverse
here checks the plumbing only; its numerical error is measured in `test_inverse_precision.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interp_cases as ic  # noqa: E402  (interpreter shims, NaN-poisoned torch.empty)

import kernels.kda.chunk_triton as ct  # noqa: E402
from kernels.kda import naive_recurrent_kda  # noqa: E402

# Variants of the fused-doubling configuration the H200 timed; the default is the substitution inverse.
_FD = ct.FUSED_DOUBLING
VARIANTS = {
    "fused_doubling": _FD,
    "tf32_inverse": dataclasses.replace(_FD, inverse_precision="tf32"),
    "prep_split": dataclasses.replace(_FD, prep_split=True),
    "bwd_split": dataclasses.replace(_FD, bwd_split=True),
    "all": dataclasses.replace(_FD, inverse_precision="tf32", prep_split=True, bwd_split=True),
    # K = 32 in 16-wide slices: the split kernels' key-slice loops run twice.
    "split_bks16": dataclasses.replace(_FD, prep_split=True, bwd_split=True, prep_key_slice=16, bwd_key_slice=16),
    # The substitution inverse with the fused backward chunk kernel and the tf32x3 products.
    "substitution_fused_bwd": ct.TileConfig(bwd_split=False, inverse_precision="tf32x3"),
    # The default with bf16 operands in the pair-region products (not equal to the default).
    "bwd_pairs_bf16": ct.TileConfig(bwd_pair_dtype="bf16"),
    "pairs_bf16": ct.TileConfig(prep_pair_dtype="bf16", bwd_pair_dtype="bf16"),
}
# Positive keys (as L2Norm(SiLU(·)) gives) with weak gates, logsigmoid(N(0, 1) + 5): the doubling
# inverse loses all accuracy here (docs/log/kda.md); the default (substitution) must not.
WEAK = {"default": ct.TileConfig(), "fused_doubling": _FD}
# (B, T, H, K, V, dtype, with_h0): T = 100 is one full and one partial chunk; K ≠ V, V not a power of two.
CASES = {
    "fp32_h0": (2, 100, 2, 32, 24, torch.float32, True),
    "fp32_no_h0": (1, 100, 2, 32, 24, torch.float32, False),
    "bf16_h0": (1, 100, 2, 32, 24, torch.bfloat16, True),
}
KERNELS = ["_prep_kernel", "_prep_pairs_kernel", "_prep_solve_kernel",
           "_bwd_chunk_kernel", "_bwd_values_kernel", "_bwd_pairs_kernel"]


class _Counted:
    """A kernel whose launches are counted (and the inverse precision it is given recorded), so a
    variant that silently ran the default path fails."""

    def __init__(self, fn, counts):
        self.fn, self.counts = fn, counts

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.counts[self.fn.__name__] = self.counts.get(self.fn.__name__, 0) + 1
            if "INV_PREC" in kwargs:
                self.counts["INV_PREC=" + kwargs["INV_PREC"]] = 1
            if kwargs.get("PAIR_BF16"):
                self.counts["PAIR_BF16 " + self.fn.__name__] = 1
            return self.fn[grid](*args, **kwargs)

        return launch


def run(cfg, inputs, with_h0):
    counts: dict[str, int] = {}
    saved = {n: getattr(ct, n) for n in KERNELS}
    old = ct.set_tile_config(cfg)
    try:
        for n in KERNELS:
            setattr(ct, n, _Counted(saved[n], counts))
        o, s, g = ic.grads(ic.triton_kda, list(inputs), with_h0)
    finally:
        ct.set_tile_config(old)
        for n, fn in saved.items():
            setattr(ct, n, fn)
    return {"o": o, "ht": s, **g}, counts


def finite(out) -> bool:
    return all(bool(torch.isfinite(x).all()) for x in out.values())


def weak_decay_inputs(B=1, T=100, H=2, K=32, V=24, seed=22):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.rand(B, T, H, K, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.rand(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 5.0)
    beta = torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen)
    return q, k, v, g, beta, h0


def main():
    for case, (B, T, H, K, V, dtype, with_h0) in CASES.items():
        inputs = ic.make_inputs(B, T, H, K, V, seed=21, dtype=dtype)
        o_r, s_r, g_r = ic.grads(naive_recurrent_kda, [x.float() for x in inputs], with_h0)
        ref = {"o": o_r, "ht": s_r, **g_r}
        base, base_counts = run(ct.TileConfig(), inputs, with_h0)
        rows = {"default": (base, base_counts)}
        rows.update({name: run(cfg, inputs, with_h0) for name, cfg in VARIANTS.items()})
        for name, (out, counts) in rows.items():
            print(json.dumps({
                "variant": name, "case": case, "finite": finite(out), "launches": counts,
                "vs_default": {n: ic.rel(out[n], base[n]) for n in out},
                "vs_reference": {n: ic.rel(out[n], ref[n]) for n in out},
                "bitwise_default": all(torch.equal(out[n], base[n]) for n in out),
            }), flush=True)
    inputs = weak_decay_inputs()
    o_r, s_r, g_r = ic.grads(naive_recurrent_kda, [x.double() for x in inputs], True)
    ref = {"o": o_r, "ht": s_r, **g_r}
    for name, cfg in WEAK.items():
        out, counts = run(cfg, inputs, True)
        print(json.dumps({"variant": name, "case": "fp32_weak_decay_positive_k", "finite": finite(out),
                          "launches": counts, "vs_reference": {n: ic.rel(out[n], ref[n]) for n in out}}), flush=True)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    main()
