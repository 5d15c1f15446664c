"""The packed MXFP4 export (k3model/quantize.py) measured: its size on disk against a bf16 export,
whether the loaded model computes what the QAT model computes, the audit, FLOOR against RCEIL on
the expert weights, and decode speed of the quantized model against the QAT and the plain float
model (same weights) in the same run, alternated.

    OMP_NUM_THREADS=1 python benchmarks/model/quantize_export.py --profiles smoke tiny \
        --out benchmarks/results/mx/2026-12-01_quantize_export_cpu.json

Measured profiles are random-initialised (prepare_qat on a fresh model): sizes and bit-equality do
not depend on training; the output agreement and speed are those of a random model. Larger
profiles (`--sizes-only`) get their sizes from the parameter counts (k3model.params, meta device):
MXFP4 experts take 17/32 byte a value (K/2 code bytes + K/32 scale bytes per row).
"""

from __future__ import annotations

import argparse
import datetime
import copy
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import run_header
from kernels.mx import quantize_mx
from k3model.config import get_profile
from k3model.generate import GenerationConfig, generate
from k3model.model import K3Model
from k3model.params import count_params
from k3model.quantize import EXPERT_WEIGHTS, audit_quantized, export_quantized, load_quantized
from k3model.train.qat import prepare_qat


def weight_error(model: K3Model) -> dict[str, float]:
    """Relative RMS error of the dequantized routed expert weights, per scale rounding."""
    out = {}
    for rounding in ("ceil", "floor"):
        num = den = 0.0
        for moe in model.moe_layers():
            for name in EXPERT_WEIGHTS:
                w = getattr(moe, name).detach()
                num += float(((quantize_mx(w, "fp4_e2m1", scale_rounding=rounding).dequantize() - w) ** 2).sum())
                den += float((w ** 2).sum())
        out[rounding] = (num / den) ** 0.5
    return out


def decode_tokens_per_s(model: K3Model, ids_BT: torch.Tensor, new_tokens: int) -> float:
    generate(model, ids_BT, GenerationConfig(max_new_tokens=2))  # warm-up
    t0 = time.perf_counter()
    generate(model, ids_BT, GenerationConfig(max_new_tokens=new_tokens))
    return ids_BT.shape[0] * new_tokens / (time.perf_counter() - t0)


def measure(profile: str, new_tokens: int, rounds: int) -> dict:
    torch.manual_seed(0)
    model = prepare_qat(K3Model(replace(get_profile(profile).model, vision=None))).eval()
    ids_BT = torch.randint(0, model.cfg.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    result = {"profile": profile, "vision": False, "weight_rel_rms_error": weight_error(model)}
    with tempfile.TemporaryDirectory() as tmp:
        for other in (None, torch.bfloat16):
            t0 = time.perf_counter()
            info = export_quantized(model, Path(tmp) / str(other), other_dtype=other)
            export_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            qmodel, _ = load_quantized(info.path)
            load_s = time.perf_counter() - t0
            key = "rest_bf16" if other else "rest_as_model"
            result[key] = {"file_bytes": info.file_bytes, "bf16_file_bytes": info.bf16_file_bytes,
                           "ratio_to_bf16": info.ratio_to_bf16, "expert_bytes": info.expert_bytes,
                           "expert_bf16_bytes": info.expert_bf16_bytes, "export_s": export_s, "load_s": load_s}
        # Agreement with the QAT model (rest as the model has it: the experts are the only change).
        qmodel, _ = load_quantized(Path(tmp) / "None")
        with torch.no_grad():
            a, b = model(ids_BT).logits_BTV, qmodel(ids_BT).logits_BTV
        cfg = GenerationConfig(max_new_tokens=new_tokens)
        result["vs_qat"] = {"logits_max_abs_diff": float((a - b).abs().max()), "logits_bitwise": bool(torch.equal(a, b)),
                            "greedy_tokens_equal": bool(torch.equal(generate(model, ids_BT, cfg),
                                                                    generate(qmodel, ids_BT, cfg)))}
        report = audit_quantized(qmodel, ids_BT)
        result["audit"] = {"expected": len(report.expected), "quantized": len(report.quantized), "ok": report.ok}
        # Same weights without fake quantization: the float model the MXFP4 one replaces.
        plain = copy.deepcopy(model)
        for moe in plain.moe_layers():
            moe.fake_quant_mx = None
        models = {"mxfp4_torch_path": qmodel, "qat_fp32": model, "plain_fp32": plain}
        tps: dict[str, list[float]] = {k: [] for k in models}
        for _ in range(rounds):  # alternated, so machine load hits all alike
            for k, m in models.items():
                tps[k].append(decode_tokens_per_s(m, ids_BT, new_tokens))
        med = {k: statistics.median(v) for k, v in tps.items()}
        result["decode_tokens_per_s"] = {"runs": tps, "median": med,
                                         "mxfp4_over_plain": med["mxfp4_torch_path"] / med["plain_fp32"]}
    return result


def sizes_from_counts(profile: str) -> dict:
    counts = count_params(profile)
    routed = counts["moe"]["routed"]
    total = counts["total_with_mtp"]
    mx = routed * 17 / 32 + (total - routed) * 2
    return {"profile": profile, "params": total, "routed_expert_params": routed, "bf16_bytes": 2 * total,
            "mxfp4_experts_bf16_rest_bytes": mx, "ratio_to_bf16": mx / (2 * total)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", nargs="+", default=["smoke", "tiny"])
    ap.add_argument("--sizes-only", nargs="+", default=["small", "k3"])
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=f"benchmarks/results/mx/{datetime.date.today()}_quantize_export_cpu.json")
    args = ap.parse_args()
    result = {"benchmark": "quantize_export", "header": run_header(),
              "measured": [measure(p, args.new_tokens, args.rounds) for p in args.profiles],
              "from_counts": [sizes_from_counts(p) for p in args.sizes_only]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
