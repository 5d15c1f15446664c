"""One question: do the regionally compiled model's gradients (Inductor, CUDA) differ from the eager
model's more than bf16 autocast alone moves the eager ones? Prints the relative gradient-norm
differences of eager/compiled × fp32/bf16 against eager fp32, and the parameters that differ most.

    PYTHONPATH=$PWD python benchmarks/probes/compiled_grads.py [--out result.json]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
from dataclasses import replace

import torch

from k3model.compiled import compile_regions
from k3model.config import get_profile
from k3model.model import K3Model


def grads(model, ids, bf16: bool) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with ctx:
        loss = model.compute_loss(ids)["loss/total"]
    loss.backward()
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def rel(a: dict, b: dict) -> float:
    num = sum(float((a[n] - b[n]).norm() ** 2) for n in b)
    return (num / sum(float(b[n].norm() ** 2) for n in b)) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0, activation_checkpointing=True)
    torch.manual_seed(0)
    eager = K3Model(cfg).cuda().train()
    compiled = compile_regions(copy.deepcopy(eager), dynamic=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 128), device="cuda")
    # Compiled fp32 is left out: torch._grouped_mm's meta function takes bf16 only (torch 2.11).
    runs = {f"{kind}_{dt}": grads(model, ids, dt == "bf16")
            for kind, model, dts in (("eager", eager, ("fp32", "bf16")), ("compiled", compiled, ("bf16",)))
            for dt in dts}
    ref = runs["eager_fp32"]
    result = {name: rel(g, ref) for name, g in runs.items()}
    result["compiled_bf16_vs_eager_bf16"] = rel(runs["compiled_bf16"], runs["eager_bf16"])
    worst = {}
    for pair in (("eager_bf16", "eager_fp32"), ("compiled_bf16", "eager_bf16")):
        a, b = runs[pair[0]], runs[pair[1]]
        per = sorted(((float((a[n] - b[n]).norm() / (b[n].norm() + 1e-30)), n) for n in b), reverse=True)
        worst["_vs_".join(pair)] = per[:10]
        missing = sorted(set(b) ^ set(a))
        if missing:
            worst["_vs_".join(pair) + "_grad_missing"] = missing
    result["worst"] = worst
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
