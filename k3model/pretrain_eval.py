"""What a pretraining checkpoint has learned: held-out perplexity, scattered-clue accuracy by length
and clue distance (claim 1 of DESIGN.md §5), and VQA accuracy.

Clue and VQA answers are scored by teacher forcing: the model reads prompt + answer once, and an
answer counts as correct when the argmax at every answer position is the answer's token — exactly
what greedy decoding of len(answer) tokens would produce, at the cost of one forward pass.
Each clue example has a control twin with the same tokens whose needed clues sit next to the
question; the gap between the two isolates long-range recall from the task itself.
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
from k3model.pretrain_data import PretrainData, pixels_to_tensor

PPL_WINDOWS = 8
PPL_LENGTH = 512
VQA_QUESTIONS = 64


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


def clue_accuracy(model: K3Model, data: PretrainData, device: str, examples_per_cell: int,
                  max_length: int | None) -> dict[str, float]:
    """Accuracy per (length, distance bucket) cell, per bucket and per length, scattered and control."""
    table = data.clue_eval
    cols = {name: table.column(name).to_pylist() for name in
            ("length_target", "bucket_lo", "bucket_hi", "pair_id", "variant", "prompt_ids", "answer_ids")}
    seen_pairs: dict[tuple, set] = defaultdict(set)
    hits: dict[str, list[bool]] = defaultdict(list)
    for i in range(len(cols["pair_id"])):
        length, lo, hi = cols["length_target"][i], cols["bucket_lo"][i], cols["bucket_hi"][i]
        if max_length is not None and length > max_length:
            continue
        cell = (length, lo, hi)
        pairs = seen_pairs[cell]
        if cols["pair_id"][i] not in pairs and len(pairs) >= examples_per_cell:
            continue
        pairs.add(cols["pair_id"][i])
        ok = answer_is_argmax(model, cols["prompt_ids"][i], cols["answer_ids"][i], device)
        variant = cols["variant"][i]
        for key in (f"len{length}/d{lo}-{hi}", f"d{lo}-{hi}", f"len{length}", "all"):
            hits[f"{variant}/{key}"].append(ok)
    return {f"eval/clue_acc/{key}": sum(v) / len(v) for key, v in sorted(hits.items())}


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
             examples_per_cell: int = 8, max_length: int | None = None, ppl_windows: int = PPL_WINDOWS,
             vqa_questions: int = VQA_QUESTIONS) -> dict[str, float]:
    model.eval()
    metrics = {"eval/ppl": heldout_perplexity(model, data, device, windows=ppl_windows)}
    metrics.update(clue_accuracy(model, data, device, examples_per_cell, max_length))
    metrics.update(vqa_accuracy(model, data, cfg, device, vqa_questions))
    return metrics
