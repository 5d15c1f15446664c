"""QAT against PTQ at matched training tokens (claim 5; research/posttrain-anchors.md §4.2, §4.4;
torchao's `docs/source/workflows/qat.md` protocol, ModelOpt's "high precision first, then QAT").

Given one recipe step — here SFT (`k3model.train.sft.train`) from a starting checkpoint, the same
config, data and seed for every arm — three arms train for the same number of steps (so the same
number of own tokens, the batches being a pure function of (seed, step)):

    (a) qat         QAT from the first step (prepare_qat), then packed MXFP4 (convert_to_mx, the same
                    quantizer: the exported weights are exactly what training saw)
    (b) ptq         the step without quantization (the high-precision arm: fp32 on the CPU, bf16
                    autocast on CUDA), then MXFP4 post-training quantization
    (c) qat_short   (b)'s recipe for (1 − f) of the steps, then QAT for the remaining f, at lr × `short_lr_scale`

and the high-precision model of (b) is the reference ("bf16"). Each quantized model and the
reference are judged on the same held-out demonstrations: own-token loss (lower is better),
KL(p_bf16 ‖ p_quantized) per own token, and torchao's

    recovered % = (QAT − PTQ) / (bf16 − PTQ)          (on the held-out loss; the sign cancels)

and, when `tasks` are given, task success through `k3model.train.evaluate.evaluate` (the grpo
area's API; the comparison runs without it on loss and KL alone). Every arm runs under each scale
rounding in `scale_roundings` (the FLOOR vs RCEIL ablation: QAT and export with the same one).

Claim 5 is judged where quantization matters (`compare_scope`): at tiny, K3's experts-only scope
costs ~0 nats, so a ratio of drops there is noise. `compare_scope` runs, per seed, the
high-precision step and a QAT step at a given `k3model.train.qat` scope (QAT_SCOPES; "all_linear"
for the judged claim) under each scale rounding, and PTQ as the same quantizer applied to that
seed's high-precision model; each is measured on held-out windows (`corpus_windows`: the
pretraining corpus' held-out split end to end, cut into n × L windows — text the model is competent
at, where a quantization error shows in the NLL; `token_windows` cuts any token rows the same way)
as the mean next-token NLL over every window token and KL(p_bf16 ‖ p_quantized), the metric
deployers use:

    drop_arm = NLL(arm, quantized) − NLL(bf16 of the same seed)

The quantized models run the packed MXFP4 experts on kernels.mx's torch path on the CPU (bitwise
the QAT forward, docs/log/quantize.md); on CUDA the grouped GEMV differs by ~4e-4 relative.
The whole RL lineage (SFT → RL → MOPD) is not repeated per arm at tiny scale: the comparison stands
on SFT, the step QAT starts from in K3 (report §4.1.4).
Legend: V vocabulary.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import pyarrow as pa
import torch

from k3model.checkpoint import load_model
from k3model.model import IGNORE_INDEX
from k3model.quantize import convert_to_mx
from k3model.train import sft
from k3model.train.qat import check_scope, prepare_qat

logger = logging.getLogger(__name__)

ARMS = ("qat", "ptq", "qat_short")


@dataclass
class QuantComparison:
    """Per scale rounding, per arm: held-out loss, KL to the reference, recovered %; and the
    reference's own held-out loss. `tokens` is each arm's own-token count (matched by construction)."""
    reference_loss: float
    arms: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # rounding → arm → metrics
    tokens: dict[str, int] = field(default_factory=dict)
    checkpoints: dict[str, str] = field(default_factory=dict)

    def as_metadata(self) -> dict:
        flat = {"reference/eval_loss": self.reference_loss}
        for rounding, arms in self.arms.items():
            for arm, metrics in arms.items():
                for k, v in metrics.items():
                    flat[f"{rounding}/{arm}/{k}"] = v
        flat.update({f"tokens/{k}": v for k, v in self.tokens.items()})
        return flat


def recovered(qat: float, ptq: float, reference: float) -> float:
    """torchao's recovered fraction (QAT − PTQ) / (bf16 − PTQ): 1 = QAT closes the whole gap PTQ
    leaves, 0 = no better than PTQ, < 0 worse; NaN when PTQ loses nothing (no gap to recover)."""
    gap = reference - ptq
    return (qat - ptq) / gap if gap != 0 else float("nan")


@torch.no_grad()
def own_token_kl(reference, model, demos: sft.Demonstrations, batch_size: int = 8) -> float:
    """Mean over the held-out own tokens of KL(p_reference ‖ p_model) of the next token."""
    total, n = 0.0, 0
    for m in (reference, model):
        m.eval()
    device = next(model.parameters()).device
    for start in range(0, len(demos), batch_size):
        ids_BT, labels_BT = demos.batch(list(range(start, min(start + batch_size, len(demos)))), device)
        own_BT = labels_BT != IGNORE_INDEX
        logp_NV = reference(ids_BT).logits_BTV.float()[own_BT].log_softmax(-1)
        logq_NV = model(ids_BT).logits_BTV.float()[own_BT].log_softmax(-1)
        total += float((logp_NV.exp() * (logp_NV - logq_NV)).sum())
        n += int(own_BT.sum())
    return total / max(n, 1)


def _load(directory: Path):
    """An arm's checkpoint for its evaluation, on the GPU where there is one (as the arm trained)."""
    return load_model(directory, "cuda" if torch.cuda.is_available() else "cpu", qat=False)[0].eval()


def compare_qat_ptq(cfg: sft.SFTConfig, demos: pa.Table | str | Path, eval_demos: pa.Table | str | Path,
                    out_dir: str | Path, init_checkpoint: str | Path | None = None, *,
                    short_frac: float = 0.25, short_lr_scale: float = 0.2,
                    scale_roundings: Sequence[str] = ("ceil", "floor"), tasks=None,
                    evaluate_fn: Callable | None = None, log_fn: Callable[[str, dict], None] | None = None
                    ) -> QuantComparison:
    """Run the three arms of the module docstring for the SFT step `cfg` (its `qat` field is
    overridden per arm) and judge them on `eval_demos` (and `tasks` with `evaluate_fn(model) ->
    success rate`, when given). Checkpoints go under `out_dir/<rounding>/<arm>`."""
    if not 0 < short_frac < 1:
        raise ValueError(f"short_frac must lie in (0, 1) (the QAT fraction of arm c's steps), got {short_frac}")
    short_steps = max(1, round(cfg.steps * short_frac))
    if short_steps >= cfg.steps:
        raise ValueError(f"cfg.steps = {cfg.steps} leaves no high-precision steps before arm c's {short_steps} QAT "
                         "steps: raise steps or lower short_frac")
    out_dir = Path(out_dir)
    log = log_fn or (lambda arm, metrics: None)
    eval_table, _ = sft._read_demos(eval_demos)

    # (b) the high-precision step, shared by every rounding's PTQ arm and by the reference.
    ref_run = sft.train(replace(cfg, qat=False), demos, out_dir / "bf16", init_checkpoint)
    reference = _load(ref_run.checkpoint_dir)
    held_out = sft.Demonstrations(eval_table, reference.cfg.vocab_size)
    ref_loss = sft.demo_loss(reference, held_out, cfg.batch_size)["eval/loss"]
    result = QuantComparison(ref_loss, tokens={"bf16": ref_run.tokens_seen})
    result.checkpoints["bf16"] = str(ref_run.checkpoint_dir)
    ref_success = evaluate_fn(reference) if evaluate_fn is not None and tasks is not None else None
    log("bf16", {"eval/loss": ref_loss})
    # (c)'s high-precision part: the first steps of (b)'s recipe.
    head_run = sft.train(replace(cfg, qat=False, steps=cfg.steps - short_steps), demos, out_dir / "bf16_head",
                         init_checkpoint)

    for rounding in scale_roundings:
        runs = {"qat": sft.train(replace(cfg, qat=True, qat_scale_rounding=rounding), demos,
                                 out_dir / rounding / "qat", init_checkpoint),
                "qat_short": sft.train(replace(cfg, qat=True, qat_scale_rounding=rounding, steps=short_steps,
                                               lr=cfg.lr * short_lr_scale, warmup_frac=0.0),
                                       demos, out_dir / rounding / "qat_short", head_run.checkpoint_dir)}
        models = {"qat": convert_to_mx(_load(runs["qat"].checkpoint_dir), rounding),
                  "ptq": convert_to_mx(copy.deepcopy(reference), rounding),
                  "qat_short": convert_to_mx(_load(runs["qat_short"].checkpoint_dir), rounding)}
        result.tokens[f"{rounding}/qat"] = runs["qat"].tokens_seen
        result.tokens[f"{rounding}/qat_short"] = head_run.tokens_seen + runs["qat_short"].tokens_seen
        arms: dict[str, dict[str, float]] = {}
        for arm, model in models.items():
            metrics = {"eval_loss": sft.demo_loss(model, held_out, cfg.batch_size)["eval/loss"],
                       "kl_to_bf16": own_token_kl(reference, model, held_out, cfg.batch_size)}
            if ref_success is not None:
                metrics["success"] = evaluate_fn(model)
                metrics["bf16_success"] = ref_success
            arms[arm] = metrics
            if arm in runs:
                result.checkpoints[f"{rounding}/{arm}"] = str(runs[arm].checkpoint_dir)
        for arm in ("qat", "qat_short"):
            arms[arm]["recovered"] = recovered(arms[arm]["eval_loss"], arms["ptq"]["eval_loss"], ref_loss)
            arms[arm]["drop_over_ptq_drop"] = ((arms[arm]["eval_loss"] - ref_loss) /
                                               (arms["ptq"]["eval_loss"] - ref_loss)
                                               if arms["ptq"]["eval_loss"] != ref_loss else float("nan"))
            if "success" in arms[arm]:
                arms[arm]["recovered_success"] = recovered(arms[arm]["success"], arms["ptq"]["success"], ref_success)
        result.arms[rounding] = arms
        for arm, metrics in arms.items():
            log(f"{rounding}/{arm}", metrics)
    return result


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
