"""What a pretraining checkpoint has learned: held-out perplexity, scattered-clue accuracy by length
and clue distance (claim 1 of DESIGN.md §5), and VQA accuracy.

Clue and VQA answers are scored by teacher forcing: the model reads prompt + answer once, and an
answer counts as correct when the argmax at every answer position is the answer's token — exactly
what greedy decoding of len(answer) tokens would produce, at the cost of one forward pass.
Each clue example has a control twin with the same tokens whose needed clues sit next to the
question; the gap between the two isolates long-range recall from the task itself.

Clue rows of one cell all have the cell's length, so they run as batches of up to
`CLUE_BATCH_TOKENS` tokens, and the output head runs only at the few answer positions of each row
(`answers_are_argmax`): 2.2× faster per row than one row at a time with every position's logits at
64 tokens, 1.0–1.1× from 512 on (docs/log/claim1.md). Every accuracy
`eval/clue_acc/<variant>/<key>` comes with its count `eval/clue_n/<variant>/<key>`, the n its
interval needs: `clue_distance_cases` is claim 1's test on those counts (assets/claims.py judges
with it).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

from datagen.corpus import split_texts
from datagen.packing import PackingConfig, vqa_eval_set
from datagen.tokenizer import EOS, IMAGE, encode_batch
from k3model.config import ModelConfig
from k3model.model import K3Model
from k3model.train.pretrain_data import PretrainData, pixels_to_tensor
from k3model.train.stats import wilson

PPL_WINDOWS = 8
PPL_LENGTH = 512
VQA_QUESTIONS = 64
# Tokens per batched clue forward: 32 rows of 64 tokens, 4 of 512, one from 2048 on. There the
# gated MLA layer's attention, which materializes B × heads × T² scores (no fused CPU kernel for its
# unequal q/v head dims), makes 4-row batches slower per row than single rows (docs/log/claim1.md).
CLUE_BATCH_TOKENS = 2048


@torch.no_grad()
def answer_is_argmax(model: K3Model, prompt_ids, answer_ids, device: str, images=None) -> bool:
    ids = torch.tensor([list(prompt_ids) + list(answer_ids)], device=device)
    mask = None
    if images is not None:
        mask = ids == images[1]
        images = images[0]
    logits = model(ids, images, mask).logits_BTV[0]
    start = len(prompt_ids)
    predicted = logits[start - 1: start - 1 + len(answer_ids)].argmax(-1)
    return bool((predicted == torch.tensor(list(answer_ids), device=device)).all())


@torch.no_grad()
def heldout_perplexity(model: K3Model, data: PretrainData, device: str, length: int = PPL_LENGTH,
                       windows: int = PPL_WINDOWS) -> float:
    eos = data.tokenizer.token_to_id(EOS)
    texts = split_texts(data.corpus, "heldout")
    stream = [t for doc in encode_batch(data.tokenizer, texts) for t in (*doc, eos)]
    if len(stream) < length + 1:
        raise ValueError(f"the held-out split has {len(stream)} tokens, fewer than one {length}-token window")
    starts = np.linspace(0, len(stream) - length - 1, windows).astype(int)
    nll, count = 0.0, 0
    for s in starts:
        window = torch.tensor([stream[s: s + length + 1]], device=device)
        logits = model(window[:, :-1]).logits_BTV.float()
        nll += F.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
        count += length
    return math.exp(nll / count)


@torch.no_grad()
def answers_are_argmax(model: K3Model, prompts: list[list[int]], answers: list[list[int]], device: str) -> list[bool]:
    """`answer_is_argmax` for rows of one total length (prompt + answer), in one forward: the output
    head runs only where a row's answer tokens are predicted."""
    lengths = {len(p) + len(a) for p, a in zip(prompts, answers)}
    if len(lengths) != 1:
        raise ValueError(f"rows of one batch must share prompt + answer length, got lengths {sorted(lengths)}")
    ids_BT = torch.tensor([list(p) + list(a) for p, a in zip(prompts, answers)], device=device)
    hidden_BTD = model(ids_BT, logits=False).hidden_BTD
    # Row b's answer token j is predicted at position len(prompt_b) - 1 + j.
    rows = torch.tensor([b for b, a in enumerate(answers) for _ in a], device=device)
    cols = torch.tensor([len(p) - 1 + j for p, a in zip(prompts, answers) for j in range(len(a))], device=device)
    predicted_N = model.lm_head(model.final_norm(hidden_BTD[rows, cols])).argmax(-1)
    correct_N = predicted_N == torch.tensor([t for a in answers for t in a], device=device)
    hits = torch.zeros(len(answers), dtype=torch.long, device=device).index_add_(0, rows, correct_N.long())
    return [int(h) == len(a) for h, a in zip(hits.tolist(), answers)]


def clue_accuracy(model: K3Model, data: PretrainData, device: str, examples_per_cell: int | None,
                  max_length: int | None) -> dict[str, float]:
    """Accuracy and count per (length, distance bucket) cell, per bucket and per length, scattered and
    control: the first `examples_per_cell` (scattered, control) pairs of each cell of the grid (None:
    every pair)."""
    table = data.clue_eval
    cols = {name: table.column(name).to_pylist() for name in
            ("length_target", "bucket_lo", "bucket_hi", "pair_id", "variant", "prompt_ids", "answer_ids")}
    seen_pairs: dict[tuple, set] = defaultdict(set)
    by_length: dict[int, list[int]] = defaultdict(list)
    for i in range(len(cols["pair_id"])):
        length, lo, hi = cols["length_target"][i], cols["bucket_lo"][i], cols["bucket_hi"][i]
        if max_length is not None and length > max_length:
            continue
        pairs = seen_pairs[(length, lo, hi)]
        if examples_per_cell is not None and cols["pair_id"][i] not in pairs and len(pairs) >= examples_per_cell:
            continue
        pairs.add(cols["pair_id"][i])
        by_length[len(cols["prompt_ids"][i]) + len(cols["answer_ids"][i])].append(i)
    model.eval()
    hits: dict[str, list[bool]] = defaultdict(list)
    for total, rows in sorted(by_length.items()):
        per_batch = max(CLUE_BATCH_TOKENS // total, 1)
        for start in range(0, len(rows), per_batch):
            batch = rows[start:start + per_batch]
            oks = answers_are_argmax(model, [cols["prompt_ids"][i] for i in batch],
                                     [cols["answer_ids"][i] for i in batch], device)
            for i, ok in zip(batch, oks):
                length, lo, hi, variant = (cols[c][i] for c in ("length_target", "bucket_lo", "bucket_hi", "variant"))
                for key in (f"len{length}/d{lo}-{hi}", f"d{lo}-{hi}", f"len{length}", "all"):
                    hits[f"{variant}/{key}"].append(ok)
    out = {}
    for key, v in sorted(hits.items()):
        out[f"eval/clue_acc/{key}"] = sum(v) / len(v)
        out[f"eval/clue_n/{key}"] = float(len(v))
    return out


def clue_distance_cases(stages: dict[int, dict[str, dict[str, tuple[float, int]]]]
                        ) -> tuple[dict[str, dict[int, dict[str, float]]], list[tuple[str, int, int, float]]]:
    """Claim 1's test on clue counts: `stages[s][variant][bucket] = (hits, n)`, variant "scattered" or
    "control", bucket `lo-hi` (from `clue_accuracy`'s `d<lo>-<hi>` keys).

    Stage j answers at distance bucket b where an earlier stage i fails when the whole 95 % Wilson
    interval of j's scattered accuracy at b lies above i's, and stage i's failure there is the
    distance's: i's control twins (the same questions with the clues next to them) score above its
    scattered ones at b, again with the intervals apart. Without that second condition a later stage
    that merely learned the task would pass for one that learned long context.

    Returns the table {bucket: {stage: {acc, lo, hi, n, control, control_lo}}} (buckets by distance,
    stages with n > 0) and the cases (bucket, i, j, acc_j − acc_i) that meet both conditions."""
    buckets = sorted({b for v in stages.values() for b in v.get("scattered", {})}, key=lambda b: int(b.lstrip("d").split("-")[0]))
    table: dict[str, dict[int, dict[str, float]]] = {}
    cases = []
    for b in buckets:
        for s in sorted(stages):
            hits, n = stages[s].get("scattered", {}).get(b, (0, 0))
            c_hits, c_n = stages[s].get("control", {}).get(b, (0, 0))
            if n:
                lo, hi = wilson(hits, n)
                c_lo, _ = wilson(c_hits, c_n)
                table.setdefault(b, {})[s] = {"acc": hits / n, "lo": lo, "hi": hi, "n": n,
                                              "control": c_hits / c_n if c_n else None, "control_lo": c_lo}
        row = table.get(b, {})
        for i in sorted(row):
            for j in sorted(row):
                if j > i and row[j]["lo"] > row[i]["hi"] and row[i]["control_lo"] > row[i]["hi"]:
                    cases.append((b, i, j, row[j]["acc"] - row[i]["acc"]))
    return table, cases


def vqa_accuracy(model: K3Model, data: PretrainData, cfg: ModelConfig, device: str,
                 questions: int = VQA_QUESTIONS) -> dict[str, float]:
    if cfg.vision is None:
        return {}
    table = vqa_eval_set(PackingConfig(image_tokens=cfg.vision.tokens_per_image), tokenizer=data.tokenizer,
                         images=data.images)
    n = min(questions, len(table))
    image_token = data.tokenizer.token_to_id(IMAGE)
    rows = table.slice(0, n).to_pylist()
    correct = 0
    for row in rows:
        pixels = pixels_to_tensor(data.image_pixels_NHWC[[row["image_id"]]], device)
        correct += answer_is_argmax(model, row["prompt_ids"], row["answer_ids"], device, (pixels, image_token))
    return {"eval/vqa_acc": correct / max(n, 1), "eval/vqa_questions": float(n)}


def evaluate(model: K3Model, data: PretrainData, cfg: ModelConfig, device: str, seed: int = 0,
             examples_per_cell: int | None = 8, max_length: int | None = None, ppl_windows: int = PPL_WINDOWS,
             vqa_questions: int = VQA_QUESTIONS) -> dict[str, float]:
    model.eval()
    metrics = {"eval/ppl": heldout_perplexity(model, data, device, windows=ppl_windows)}
    metrics.update(clue_accuracy(model, data, device, examples_per_cell, max_length))
    metrics.update(vqa_accuracy(model, data, cfg, device, vqa_questions))
    return metrics
