"""Which of the small model's operations give a row other bits when it shares the call with other
rows (T rows at once, as a speculative verify runs them, against one row at a time, as a decode
step does), on CUDA in bf16: every distinct Linear shape of the model, the KDA layer's
ShortConv (the few-token tap path against the one-token step), RMSNorm and the L2 norm.

    PYTHONPATH=$PWD python3 benchmarks/probes/op_rows.py --profile small --out OUT.json

Random inputs; a count of differing rows over --trials calls per op and row count.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from benchmarks.common import run_header
from k3model.common import RMSNorm, ShortConv
from k3model.config import get_profile
from k3model.kda_layer import _l2_normalize
from k3model.model import K3Model


def differing_rows(fn, make_x, T: int, trials: int) -> int:
    """Rows of fn(x [T, …]) not bitwise fn(x[t:t+1]) over `trials` random x."""
    bad = 0
    for _ in range(trials):
        x = make_x(T)
        whole = fn(x)
        for t in range(T):
            bad += not torch.equal(whole[t: t + 1], fn(x[t: t + 1]))
    return bad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="small")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--rows", default="2,5,7")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev, bf16 = args.device, torch.bfloat16
    torch.manual_seed(0)
    model = K3Model(get_profile(args.profile).model)
    shapes = sorted({(m.in_features, m.out_features, m.bias is not None) for m in model.modules()
                     if isinstance(m, torch.nn.Linear)})
    del model
    rows = [int(r) for r in args.rows.split(",")]
    result = {"probe": "op_rows", **run_header(), "args": vars(args), "ops": {}}

    def report(name, fn, make_x):
        counts = {T: differing_rows(fn, make_x, T, args.trials) for T in rows}
        result["ops"][name] = counts
        print(name, counts, flush=True)

    with torch.no_grad():
        for n_in, n_out, bias in shapes:
            w = torch.randn(n_out, n_in, device=dev, dtype=bf16) * n_in ** -0.5
            b = torch.randn(n_out, device=dev, dtype=bf16) if bias else None
            report(f"linear {n_in}->{n_out}{' +bias' if bias else ''}", lambda x, w=w, b=b: F.linear(x, w, b),
                   lambda T, n=n_in: torch.randn(T, n, device=dev, dtype=bf16))
            report(f"linear fp32 {n_in}->{n_out}", lambda x, w=w: F.linear(x.float(), w.float()),
                   lambda T, n=n_in: torch.randn(T, n, device=dev, dtype=bf16))
        cfg = get_profile(args.profile).model
        D = cfg.d_model
        H, K = cfg.kda_heads, cfg.kda_head_dim
        inner = H * K
        conv = ShortConv(inner, 4).to(dev, bf16)
        state = torch.randn(1, inner, 3, device=dev, dtype=bf16)

        # The tap path over T tokens against T one-token steps, from one state.
        def conv_check(T):
            x_1TC = torch.randn(1, T, inner, device=dev, dtype=bf16)
            y_1TC, _ = conv(x_1TC, state)
            s, bad = state, 0
            for t in range(T):
                y_11C, s = conv(x_1TC[:, t: t + 1], s)
                bad += not torch.equal(y_11C, y_1TC[:, t: t + 1])
            return bad
        result["ops"]["short_conv tap path vs steps"] = {T: sum(conv_check(T) for _ in range(args.trials)) for T in rows}
        print("short_conv", result["ops"]["short_conv tap path vs steps"], flush=True)
        norm = RMSNorm(D).to(dev, bf16)
        torch.nn.init.normal_(norm.weight)
        report(f"rmsnorm {D}", lambda x: norm(x), lambda T: torch.randn(T, 1, D, device=dev, dtype=bf16))
        report(f"l2 normalize fp32 [T, {H}, {K}]", lambda x: _l2_normalize(x.float(), 1e-6),
               lambda T: torch.randn(T, 1, H, K, device=dev, dtype=bf16))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
