"""QAT against PTQ at matched training tokens, where quantization matters (claim 5;
research/posttrain-anchors.md §4.2, §4.4; torchao's `docs/source/workflows/qat.md` protocol,
ModelOpt's "high precision first, then QAT").

Given one recipe step — here SFT (`k3model.train.sft.train`) from a starting checkpoint, the same
config, data and seed for every arm — `compare_scope` runs, per seed, arms of the same number of
steps (so the same number of own tokens, the batches being a pure function of (seed, step)):

    bf16   the step without quantization (fp32 on the CPU, bf16 autocast on CUDA): the reference
    ptq    bf16's model, then the quantizer at `scope` (post-training quantization)
    qat    QAT at `scope` from the first step (`k3model.train.qat.prepare_qat`, the same quantizer)

under each scale rounding in `scale_roundings` (the FLOOR vs RCEIL ablation: QAT and PTQ with the
same one). The scope is one of `k3model.train.qat.QUANT_SCOPES`, "all_linear" for the judged claim:
at tiny, K3's experts-only scope costs ~0 nats, so a ratio of drops there is noise
(docs/log/quantize.md, 2026-12-05). Each arm is measured on held-out windows (`corpus_windows`: the
pretraining corpus' held-out split end to end, cut into n × L windows — text the model is competent
at, where a quantization error shows in the NLL; `token_windows` cuts any token rows the same way)
as the mean next-token NLL over every window token and KL(p_bf16 ‖ p_quantized), the metric
deployers use:

    drop_arm = NLL(arm, quantized) − NLL(bf16 of the same seed)

On the CPU the experts' fake-quant forward is bitwise the packed MXFP4 export's (kernels.mx's torch
path, docs/log/quantize.md); on CUDA the grouped GEMV differs by ~4e-4 relative. The whole RL
lineage (SFT → RL → MOPD) is not repeated per arm at tiny scale: the comparison stands on SFT, the
step QAT starts from in K3 (report §4.1.4).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import pyarrow as pa
import torch

from k3model.checkpoint import load_model
from k3model.train import sft
from k3model.train.qat import check_scope, prepare_qat

logger = logging.getLogger(__name__)


def _load(directory: Path):
    """An arm's checkpoint for its evaluation, on the GPU where there is one (as the arm trained)."""
    return load_model(directory, "cuda" if torch.cuda.is_available() else "cpu", qat=False)[0].eval()


def token_windows(table: pa.Table, length: int, n: int) -> torch.Tensor:
    """[n, length] token ids: the rows' `input_ids` end to end, cut into the first n windows of
    `length` (every token scored, prompt and answer alike). Raises ValueError when the rows hold
    fewer than n × length tokens."""
    return _windows(table.column("input_ids").to_pylist(), length, n)


def corpus_windows(corpus: pa.Table, tokenizer, length: int, n: int) -> torch.Tensor:
    """[n, length] token ids of the pretraining corpus' held-out split (documents in corpus order,
    EOS after each, as the pretraining evaluation reads them), cut into the first n windows.

    Claim 5 is measured here: text the model is competent at (tiny's base model: 4.87 nats a token)
    shows what quantization costs (every-Linear PTQ +0.06 nats), where the held-out demonstrations
    (6.0 nats, every prompt token scored) show none (−0.007; docs/log/quantize.md, 2026-12-06)."""
    from datagen.corpus import split_texts
    from datagen.tokenizer import EOS, encode_batch
    eos, docs, total = tokenizer.token_to_id(EOS), [], 0
    for ids in encode_batch(tokenizer, split_texts(corpus, "heldout")):
        docs.append([*ids, eos])
        total += len(ids) + 1
        if total >= n * length:
            break
    return _windows(docs, length, n)


def _windows(rows: list[list[int]], length: int, n: int) -> torch.Tensor:
    stream = [t for row in rows for t in row]
    if len(stream) < n * length:
        raise ValueError(f"the held-out rows hold {len(stream)} tokens, fewer than {n} windows × {length}: "
                         "lower the window count or length, or add held-out rows")
    return torch.tensor(stream[: n * length]).view(n, length)


@torch.no_grad()
def window_metrics(reference, model, windows_NT: torch.Tensor) -> dict[str, float]:
    """Mean next-token NLL of `model` over every window position, and KL(p_reference ‖ p_model)
    per position (0 when `model` is `reference`)."""
    nll, kl, count = 0.0, 0.0, 0
    device = next(model.parameters()).device
    for m in (reference, model):
        m.eval()
    for ids_T in windows_NT.to(device):
        ids_1T = ids_T.unsqueeze(0)
        logq_TV = model(ids_1T).logits_BTV.float()[0, :-1].log_softmax(-1)
        nll += float(-logq_TV.gather(-1, ids_1T[0, 1:].unsqueeze(-1)).sum())
        if reference is not model:
            logp_TV = reference(ids_1T).logits_BTV.float()[0, :-1].log_softmax(-1)
            kl += float((logp_TV.exp() * (logp_TV - logq_TV)).sum())
        count += ids_T.numel() - 1
    return {"nll": nll / count, "kl_to_bf16": kl / count}


def compare_scope(cfg: sft.SFTConfig, demos: pa.Table | str | Path, windows_NT: torch.Tensor,
                  out_dir: str | Path, init_checkpoint: str | Path | None = None, *, scope: str = "all_linear",
                  seeds: Sequence[int] = (0, 1), scale_roundings: Sequence[str] = ("ceil", "floor"),
                  log_fn: Callable[[str, dict], None] | None = None) -> dict:
    """QAT against PTQ at quantization scope `scope`, `cfg.steps` matched steps from
    `init_checkpoint` per arm and seed (module docstring), on `windows_NT`. Returns
    {"scope", "steps", "windows": [n, L], "tokens": {arm: own tokens}, "seeds": {seed: {"bf16": {nll},
    rounding: {"qat"|"ptq": {nll, kl_to_bf16, drop}}}}}. Checkpoints go under
    `out_dir/seed<s>/<bf16 | rounding/qat>`."""
    check_scope(scope)
    if not seeds:
        raise ValueError("compare_scope needs at least one seed (claim 5 reads the spread of two)")
    out_dir = Path(out_dir)
    log = log_fn or (lambda arm, metrics: None)
    result: dict = {"scope": scope, "steps": cfg.steps, "windows": list(windows_NT.shape), "tokens": {}, "seeds": {}}
    for seed in seeds:
        base = replace(cfg, seed=seed)
        ref_run = sft.train(replace(base, qat=False), demos, out_dir / f"seed{seed}" / "bf16", init_checkpoint)
        reference = _load(ref_run.checkpoint_dir)
        ref = window_metrics(reference, reference, windows_NT)
        per_seed: dict = {"bf16": {"nll": ref["nll"]}}
        result["tokens"][f"seed{seed}/bf16"] = ref_run.tokens_seen
        log(f"seed{seed}/bf16", {"nll": ref["nll"]})
        for rounding in scale_roundings:
            qat_run = sft.train(replace(base, qat=True, qat_scale_rounding=rounding, qat_scope=scope), demos,
                                out_dir / f"seed{seed}" / rounding / "qat", init_checkpoint)
            result["tokens"][f"seed{seed}/{rounding}/qat"] = qat_run.tokens_seen
            models = {"qat": prepare_qat(_load(qat_run.checkpoint_dir), rounding, scope),
                      "ptq": prepare_qat(copy.deepcopy(reference), rounding, scope)}
            arms = {}
            for arm, model in models.items():
                m = window_metrics(reference, model, windows_NT)
                arms[arm] = {**m, "drop": m["nll"] - ref["nll"]}
                log(f"seed{seed}/{rounding}/{arm}", arms[arm])
            per_seed[rounding] = arms
        result["seeds"][str(seed)] = per_seed
    return result
