"""Bisect: which part of AttnRes's depth mix does Inductor (CUDA) differentiate wrongly once the mix
is compiled? (docs/gpu_runbook.md item 1.) With the mix in a method of its own, compiled regions
compile it — and the smoke model's compiled bf16 gradients came out ~100 % from fp32 (eager bf16:
24 %) with the loss unchanged.

Two levels, each variant compiled fresh (`torch._dynamo.reset()` between them):
- **unit**: one AttnRes, N random sources (fp32 and a bf16-mixed set), a random upstream gradient;
  the relative error of the output and of every input/parameter gradient against the eager fp64
  module, for the eager module in the inputs' dtype and for each compiled variant;
- **model**: the smoke model's gradient under `compile_regions` with each variant patched in, as
  `compiled_grads.py` measures it (relative gradient-norm difference against eager fp32).

Variants of `AttnRes.forward` (the one-source early return first in all of them):
  main        — the library's code (`AttnRes._mix`: the stacked sum under compile, the fix);
  mix         — the mix in a method of its own with the source-by-source sum (the bug: N = 3 wrong);
  mix_alpha_e — the mix compiled, its α computed by an eager (disabled) helper;
  mix_sum_e   — α compiled, the weighted sum in an eager (disabled) helper;
  mix_stack   — the mix compiled, the weighted sum as one stacked product and sum(0).

    PYTHONPATH=$PWD python3 benchmarks/probes/attn_res_mix_grads.py [--levels unit,model] [--out r.json]
"""

from __future__ import annotations

import argparse
import copy
import json
from dataclasses import replace

import torch

from k3model.attn_res import AttnRes

_MAIN_FORWARD = AttnRes.forward


def _weighted_sum(alpha_NBT: torch.Tensor, v_list_BTD: list[torch.Tensor]) -> torch.Tensor:
    alpha_list_BT = alpha_NBT.unbind(0)
    h_BTD = alpha_list_BT[0].unsqueeze(-1) * v_list_BTD[0]
    for alpha_BT, v_BTD in zip(alpha_list_BT[1:], v_list_BTD[1:]):
        h_BTD = h_BTD + alpha_BT.unsqueeze(-1) * v_BTD
    return h_BTD


_eager_sum = torch.compiler.disable(_weighted_sum)


def _variant(name: str):
    """forward for variant `name`; a new function object each time, so Dynamo caches nothing across."""
    if name == "main":
        return _MAIN_FORWARD

    def mix(self, sources):
        v_list_BTD = [v.float() for v in sources]
        if name == "mix_alpha_e":
            alpha = torch.compiler.disable(self._alpha)(v_list_BTD)
        else:
            alpha = self._alpha(v_list_BTD)
        if name == "mix_sum_e":
            h_BTD = _eager_sum(alpha, v_list_BTD)
        elif name == "mix_stack":
            h_BTD = (alpha.unsqueeze(-1) * torch.stack(v_list_BTD)).sum(0)
        else:
            h_BTD = _weighted_sum(alpha, v_list_BTD)
        return h_BTD.to(sources[0].dtype)

    def forward(self, sources):
        if len(sources) == 1:
            return sources[0]
        return self._probe_mix(sources)

    AttnRes._probe_mix = mix
    return forward


VARIANTS = ("main", "mix", "mix_alpha_e", "mix_sum_e", "mix_stack")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / (b.double().norm() + 1e-300))


def unit(device: str, dynamic: bool) -> dict:
    torch.manual_seed(0)
    D, B, T = 64, 2, 96
    base = AttnRes(D).to(device)
    with torch.no_grad():  # a nonzero query, so α is not uniform
        base.query.normal_(0, 0.5)
        base.key_norm.weight.uniform_(0.5, 1.5)
    out = {}
    for N in (2, 3, 5):
        for dtypes in ("fp32", "mixed"):
            srcs = [torch.randn(B, T, D, device=device) * (1 + i) for i in range(N)]
            if dtypes == "mixed":  # the embedding fp32, the sublayers' sums bf16 (autocast)
                srcs = [srcs[0]] + [s.bfloat16() for s in srcs[1:]]
            g_out = torch.randn(B, T, D, device=device)

            def run(module, sources, fn):
                xs = [s.detach().clone().requires_grad_(True) for s in sources]
                module.zero_grad(set_to_none=True)
                y = fn(module, xs)
                (y.float() * g_out.to(y.device)).sum().backward()
                grads = {f"src{i}": x.grad for i, x in enumerate(xs)}
                grads.update({n: p.grad for n, p in module.named_parameters()})
                return y, grads

            ref_mod = copy.deepcopy(base).double()
            y_ref, g_ref = run(ref_mod, [s.double() for s in srcs], lambda m, xs: _MAIN_FORWARD(m, xs))
            case = {}
            for name in ("eager",) + VARIANTS:
                torch._dynamo.reset()
                mod = copy.deepcopy(base)
                if name == "eager":
                    fn = lambda m, xs: _MAIN_FORWARD(m, xs)  # noqa: E731
                else:
                    AttnRes.forward = _variant(name)
                    mod.compile(dynamic=dynamic)
                    fn = lambda m, xs: m(xs)  # noqa: E731
                try:
                    y, g = run(mod, srcs, fn)
                    case[name] = {"out": _rel(y, y_ref), **{k: _rel(v, g_ref[k]) for k, v in g.items()
                                                            if v is not None}}
                    missing = sorted(k for k, v in g.items() if v is None)
                    if missing:
                        case[name]["missing"] = missing
                except Exception as exc:  # a variant that fails to compile is a finding, not a crash
                    case[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                finally:
                    AttnRes.forward = _MAIN_FORWARD
            out[f"N{N}_{dtypes}"] = case
    return out


def model(device: str, dynamic: bool, checkpointing: bool) -> dict:
    from benchmarks.probes.compiled_grads import grads, rel
    from k3model.compiled import compile_regions
    from k3model.config import get_profile
    from k3model.model import K3Model

    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0, activation_checkpointing=checkpointing)
    torch.manual_seed(0)
    eager = K3Model(cfg).to(device).train()
    ids = torch.randint(0, cfg.vocab_size, (2, 128), device=device)
    ref = grads(eager, ids, False)
    out = {"eager_bf16": rel(grads(eager, ids, True), ref)}
    for name in VARIANTS:
        torch._dynamo.reset()
        AttnRes.forward = _variant(name)
        try:
            compiled = compile_regions(copy.deepcopy(eager), dynamic=dynamic)
            g = grads(compiled, ids, True)
            per = sorted(((float((g[n] - ref[n]).norm() / (ref[n].norm() + 1e-30)), n) for n in ref),
                         reverse=True)
            out[name] = {"rel": rel(g, ref), "worst": per[:4], "median": per[len(per) // 2][0]}
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            AttnRes.forward = _MAIN_FORWARD
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--levels", default="model,unit")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-configs", default="1:1,1:0",
                        help="dynamic:checkpointing pairs of the model level, in order")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = {"torch": torch.__version__}

    def record(key, value):  # written after every part: a call cut by its time limit keeps what ran
        result[key] = value
        print(json.dumps({key: value}), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    for level in args.levels.split(","):
        if level == "model":
            for pair in args.model_configs.split(","):
                dynamic, ckpt = (bool(int(x)) for x in pair.split(":"))
                record(f"model_dynamic{int(dynamic)}_ckpt{int(ckpt)}", model(args.device, dynamic, ckpt))
        elif level == "unit":
            record("unit_dynamic1", unit(args.device, True))


if __name__ == "__main__":
    main()
