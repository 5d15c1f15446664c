"""The Ray tasks of the deployment assets (assets/deploy.py): no Dagster import, so a Ray worker loads
only the library. Each is `task(*args, work_dir, live) -> result` for `assets.training`.

- `quantize_student_task`: the student exported with packed MXFP4 routed experts
  (`k3model.quantize.export_quantized`, the rest bf16), loaded back (`load_quantized`), audited
  (every routed expert weight through the MX op in a prefill and a decode step), a greedy generation
  through the engine beside the float student's; the export's drop on held-out windows (K3's
  experts-only scope, the product); then claim 5's comparison at the judged scope
  (`k3model.train.quant_compare.compare_scope`) on the SFT step at matched steps, per seed.
- `train_draft_task`: `k3model.train.draft.train` against the quantized student as served (the
  packed MXFP4 export through `k3model.quantize.load_quantized`, what `k3 serve` loads) on its own
  generations from sft_data's prompts; τ_sim evaluated and speculative decoding
  (`k3model.train.draft.measure_speculative`, greedy) measured at draft lengths 1–6 on the
  chat-formatted first turns of held-out envs tasks (`k3model.train.draft.chat_prompts`), with the
  untrained MTP draft beside it: τ = 1 + accepted / rounds, acceptance by depth, and greedy parity
  with the quantized target's own plain greedy output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from assets.ray_task import LiveLog, task_device


# ----------------------------------------------------------------------------------------------
# quantized_student

def shortest_rows(path: str, n: int | None):
    """The table at `path`, or its `n` shortest rows (a cheaper comparison on small profiles)."""
    from datagen.io import read_parquet
    table = read_parquet(path)
    if n is None or table.num_rows <= n:
        return table
    lengths = table.column("n_tokens").to_pylist()
    keep = sorted(sorted(range(len(lengths)), key=lambda i: lengths[i])[:n])
    return table.take(keep).replace_schema_metadata(table.schema.metadata)


@dataclass(frozen=True)
class QuantizeJob:
    """What quantized_student does (hashed into the adapter's inputs key, logged as params)."""
    scale_rounding: str
    compare_steps: int  # SFT steps of each arm of the QAT/PTQ comparison
    compare_batch_size: int
    compare_lr: float
    scale_roundings: tuple[str, ...]
    gen_tokens: int
    max_rows: int | None = None  # the comparison on the shortest rows of each table only (None: all)
    scope: str = "all_linear"  # claim 5's quantization scope (k3model.train.qat.QUANT_SCOPES)
    seeds: tuple[int, ...] = (0, 1)
    windows: int = 8  # held-out windows of window_len tokens (product drop and claim 5)
    window_len: int = 512


@dataclass
class QuantizedResult:
    checkpoint_dir: Path
    history: list[dict]
    metrics: dict[str, float]
    export: dict
    audit: dict
    comparison: dict
    sample: dict
    resumed_from_step: int | None = None


def quantize_student_task(job: QuantizeJob, student_checkpoint: str, base_checkpoint: str, demos_path: str,
                          heldout_path: str, corpus_path: str, tokenizer_path: str, sft_cfg, work_dir: str,
                          live: LiveLog) -> QuantizedResult:
    import torch

    from k3model.checkpoint import load_model
    from k3model.engine import SamplingConfig, generate
    from k3model.quantize import audit_quantized, export_quantized, load_quantized
    from datagen.io import read_parquet
    from datagen.tokenizer import load_tokenizer
    from k3model.train.draft import table_prompts
    from k3model.train.quant_compare import compare_scope, corpus_windows, token_windows, window_metrics

    t0 = time.perf_counter()
    student, manifest = load_model(student_checkpoint, qat=False)  # the float student is what is exported
    student.eval()
    out = Path(work_dir) / "mxfp4"
    info = export_quantized(student, out, job.scale_rounding, other_dtype=torch.bfloat16,
                            manifest_extra={"data_versions": {"student": manifest["sha256"]}}, overwrite=True)
    qmodel, _ = load_quantized(out)
    prompts = table_prompts(heldout_path, 256, 2) or [[1, 2, 3, 4]]
    report = audit_quantized(qmodel, torch.tensor([prompts[0]]))
    sampling = SamplingConfig(max_new_tokens=job.gen_tokens)
    q_ids = generate(qmodel, prompts, sampling)
    f_ids = generate(student, prompts, sampling)
    agree = [sum(a == b for a, b in zip(q.token_ids, f.token_ids)) / max(len(f.token_ids), 1)
             for q, f in zip(q_ids, f_ids)]
    export = {"file_bytes": info.file_bytes, "bf16_file_bytes": info.bf16_file_bytes, "ratio_to_bf16": info.ratio_to_bf16,
              "expert_bytes": info.expert_bytes, "expert_bf16_bytes": info.expert_bf16_bytes,
              "scale_rounding": info.scale_rounding, "sha256": info.sha256, "export_s": time.perf_counter() - t0}
    audit = {"expected": len(report.expected), "quantized": len(report.quantized),
             "not_quantized": list(report.not_quantized), "ok": report.ok}
    sample = {"prompts": len(prompts), "tokens": [len(c.token_ids) for c in q_ids],
              "greedy_agreement_with_float": sum(agree) / len(agree), "first_ids": q_ids[0].token_ids[:16]}
    live(0, {"export/ratio_to_bf16": info.ratio_to_bf16, "audit/quantized": float(len(report.quantized))})

    # The product's scope (K3's: MXFP4/MXFP8 routed experts) on the held-out demonstrations, the
    # student's own distribution: the export as loaded and served against the float student.
    t1 = time.perf_counter()
    demo_windows_NT = token_windows(read_parquet(heldout_path), job.window_len, job.windows)
    float_m = window_metrics(student, student, demo_windows_NT)
    served = window_metrics(student, qmodel, demo_windows_NT)
    product = {"scope": "experts", "bf16_nll": float_m["nll"], "mxfp4_nll": served["nll"],
               "drop": served["nll"] - float_m["nll"], "kl_to_bf16": served["kl_to_bf16"],
               "windows": list(demo_windows_NT.shape)}
    live(0, {f"product/{k}": v for k, v in product.items() if isinstance(v, float)})

    # Claim 5 where quantization matters: QAT against PTQ at job.scope, matched SFT steps from the
    # base, on the corpus' held-out text (quant_compare.corpus_windows says why).
    windows_NT = corpus_windows(read_parquet(corpus_path), load_tokenizer(tokenizer_path), job.window_len, job.windows)
    demos = shortest_rows(demos_path, job.max_rows)
    comparison = compare_scope(sft_cfg, demos, windows_NT, Path(work_dir) / "compare", base_checkpoint,
                               scope=job.scope, seeds=job.seeds, scale_roundings=job.scale_roundings,
                               log_fn=lambda arm, m: live(0, {f"compare/{arm}/{k}": v for k, v in m.items()}))
    metrics = {"export/ratio_to_bf16": info.ratio_to_bf16, "export/file_bytes": float(info.file_bytes),
               "audit/ok": float(report.ok), "product/drop": product["drop"], "product/kl_to_bf16": product["kl_to_bf16"],
               "perf/compare_s": time.perf_counter() - t1,
               **{f"compare/seed{seed}/{rounding}/{arm}/{k}": float(v)
                  for seed, per in comparison["seeds"].items() for rounding, arms in per.items() if rounding != "bf16"
                  for arm, m in arms.items() for k, v in m.items()}}
    live(1, metrics)
    return QuantizedResult(out, [], metrics, export, audit, {**comparison, "product": product}, sample)


# ----------------------------------------------------------------------------------------------
# draft_model

@dataclass(frozen=True)
class DraftJob:
    """What draft_model does (hashed into the adapter's inputs key, logged as params)."""
    train: object  # k3model.train.draft.DraftTrainConfig
    max_prompt_tokens: int  # of the training prompts (sft_data's assistant turns)
    train_prompts: int
    eval_prompts: int  # held-out task prompts τ_sim is evaluated on
    measure_prompts: int  # held-out task prompts speculative decoding is measured on (after the eval ones)
    measure_tokens: int
    # The held-out tasks (k3model.train.recipes.eval_plan's): families, efforts, harnesses, first seed.
    families: tuple[str, ...] = ()
    efforts: tuple[str, ...] = ()
    harnesses: tuple[str, ...] = ()
    task_seed: int = 0
    draft_lens: tuple[int, ...] = (1, 2, 3, 4, 5, 6)


@dataclass
class DraftResult:
    checkpoint_dir: Path
    history: list[dict]
    metrics: dict[str, float]
    evals: list[dict]
    measured: dict = field(default_factory=dict)  # {"trained"|"mtp_untrained": {draft_len: {...}}}
    resumed_from_step: int | None = None
    prompts: dict = field(default_factory=dict)  # what the held-out prompts are: counts by family, effort, harness
    target: dict = field(default_factory=dict)  # the target's sha256 and quantization format


def train_draft_task(job: DraftJob, quantized_checkpoint: str, demos_path: str, tokenizer_path: str,
                     work_dir: str, live: LiveLog) -> DraftResult:
    from collections import Counter

    from datagen.tokenizer import load_tokenizer
    from k3model.draft import draft_from_mtp, load_draft
    from k3model.engine import context_length
    from k3model.quantize import load_quantized
    from k3model.train.draft import chat_prompts, measure_speculative, table_prompts, train

    # The target is the quantized student as `k3 serve` runs it (packed MXFP4 experts, MXFP8 expert
    # activations, the rest as exported): the draft trains against and is measured on that forward,
    # on the target's device (k3model.train.draft follows it).
    target, manifest = load_quantized(quantized_checkpoint, task_device())
    target.eval()
    # A prompt and its generation must fit the student's context.
    limit = context_length(target)
    new_tokens = max(job.train.gen_tokens, job.measure_tokens)
    cap = job.max_prompt_tokens if limit is None else min(job.max_prompt_tokens, limit - new_tokens - 1)
    prompts = table_prompts(demos_path, cap, job.train_prompts)
    if not prompts:
        raise ValueError(f"sft_data holds no assistant-turn prompt of at most {cap} tokens: raise max_prompt_tokens")
    held_out = chat_prompts(load_tokenizer(tokenizer_path), job.families, job.efforts, job.harnesses,
                            job.eval_prompts + job.measure_prompts, job.task_seed,
                            (limit - new_tokens - 1) if limit is not None else 1 << 20)
    eval_prompts = [p.ids for p in held_out[: job.eval_prompts]]
    measure_set = held_out[job.eval_prompts:]
    measure = [p.ids for p in measure_set]
    described = {"eval": len(eval_prompts), "measure": len(measure),
                 "measure_tokens": [len(p) for p in measure],
                 "measure_by_family": dict(Counter(p.family for p in measure_set)),
                 "measure_by_effort": dict(Counter(p.effort for p in measure_set)),
                 "measure_by_harness": dict(Counter(p.harness for p in measure_set)),
                 "seeds_from": job.task_seed}
    result = train(job.train, target, prompts, work_dir, eval_prompts=eval_prompts, target_manifest=manifest,
                   log_fn=live)
    draft, _ = load_draft(result.checkpoint_dir, target)
    t0 = time.perf_counter()
    measured = measure_speculative(target, {"trained": draft.eval(), "mtp_untrained": draft_from_mtp(target).eval()},
                                   measure, job.measure_tokens, job.draft_lens)
    metrics = {**result.metrics, "perf/measure_s": time.perf_counter() - t0}
    for name, rows in measured.items():
        for k, row in rows.items():
            metrics[f"spec/{name}/tau_k{k}"] = row["acceptance_length"]
            if row["speedup"] is not None:
                metrics[f"spec/{name}/speedup_k{k}"] = row["speedup"]
            metrics[f"spec/{name}/parity_k{k}"] = row["greedy_parity"]
    live(job.train.steps, {k: v for k, v in metrics.items() if k.startswith("spec/")})
    target_info = {"sha256": manifest["sha256"], "quantization": manifest["quantization"]["format"],
                   "scale_rounding": manifest["quantization"]["scale_rounding"]}
    return DraftResult(Path(result.checkpoint_dir), result.history, metrics, result.evals, measured,
                       result.resumed_from_step, described, target_info)
