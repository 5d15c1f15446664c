"""The generation engine: batched decoding with exact token ids and log-probabilities, and scoring.

    cfg  = SamplingConfig(max_new_tokens=64, temperature=1.0, top_p=0.95, stop_ids=(eos,))
    outs = generate(model, [[1, 5, 9], [1, 7]], cfg, generator=torch.Generator().manual_seed(0))
    outs[0].token_ids, outs[0].logprobs, outs[0].model_logprobs, outs[0].finish_reason
    lps  = score(model, [prompt + outs[0].token_ids], [len(prompt)])   # teacher-forced, chunked path

Sampling, per row: greedy when temperature == 0, else softmax(logits / temperature) restricted to the
top_k largest logits and then to the smallest set whose probability reaches top_p (nucleus), both
optional. `logprobs` are the log-probabilities of the sampled ids under exactly that distribution
(0.0 for greedy: the argmax is taken with probability 1); `model_logprobs` under the untempered,
unfiltered model, log_softmax(logits). Both in fp32. `score` recomputes the latter through the
training forward (chunked KDA, expanded MLA); the difference between the two is the rollout-vs-
training mismatch RL corrects for (research/posttrain-anchors.md §1.5).

How rows of different lengths share a batch: per-row positions, no padding. The model has no
positional encoding, so a row's length matters only to MLA, which attends to exactly that row's
cached entries (k3model/cache.py). Prompts are prefilled in groups of equal length (identical
prompts once, then `fork`), the prefilled caches are stacked, and decode steps feed one token per
row. Left padding would also be possible (NoPE), but pad tokens would pass through the KDA recurrence and
the short convolutions and would have to be neutralised exactly (β = 0, g = 0, zeroed conv inputs),
and the chunked prefill of a padded prompt splits its chunks at other positions than the same
prompt alone: its numbers would depend on the longest prompt in the batch.

Batch invariance (a row gets bitwise what it gets alone, greedy, CPU, one intra-op thread — with two
threads the CPU kernels split some reductions by the batch's shape, and a row parts from itself
alone by ~1e-7 in log-probability, same tokens; docs/log/engine.md): besides the above, the CPU
GEMMs give a row the same bits only when the matrix has at least 4 rows (oneDNN, and MKL outside
the strict mode that k3model/__init__.py sets, take other kernels by row count; docs/log/engine.md),
so decode batches are padded to `MIN_ROWS` rows, the prefill's output head runs over ≥ 4 rows,
prompts shorter than MIN_ROWS are prefilled alone, and the MoE runs every routed expert on every token of small CPU inference
batches (k3model/moe.py `_dense_experts`). Small elementwise tensors whose length follows the batch
(the router's sigmoid over [M, E], KDA's β over [B, T, H], AttnRes's depth softmax) run through
whole vectors (`k3model.common.sigmoid_vectorized`): torch puts a tensor's remainder through scalar
code with other last bits, so a row's bits would depend on where its values land (docs/log/tiny.md);
the C kernels of kernels/situ_glu and
kernels/short_conv give an element the same bits wherever it sits. Not covered: a batched prefill of long prompts takes the
per-expert loop, where an expert that gets 1–3 of the batch's tokens gets other GEMM kernels than
it would alone (rare at hundreds of tokens; not tested).
Finished rows leave the batch (the cache keeps the remaining rows) while at least MIN_ROWS remain.

Continuous batching (`SlotBatch`, used by k3model/train/rollout.py's episodes): a batch of fixed
slots that rows join (a one-row cache copied in) and leave (copied out) between steps, free slots
riding along; on CUDA its step is the same captured `GraphStep` over a static cache, so multi-turn
episodes that keep their caches decode through the graph. `decode(keep_caches=True)` itself stays
eager: its finished rows leave a shrinking dynamic batch, which a fixed-shape graph cannot follow.

On CUDA, `decode` replays one captured step (`GraphStep`: a static cache, the whole MLA buffer
under a length mask, no host synchronisation inside the step); finished rows ride along to the
end. A step is captured once per model, batch and capacity (rounded up to a power of two) and
reused by later calls (`reused`), each call loading its prefilled cache into the step's static one. There the engine's model_logprobs and `score` can part by far more than rounding: the Triton
chunked KDA differs from the recurrence by ~1e-4, enough to flip MoE routing choices
(docs/log/engine.md, routing flips).
Legend: B batch rows, V vocabulary.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from k3model.cache import LatentCache, ModelCache
from k3model.kda_layer import KDAState
from k3model.config import PROFILES, get_profile

# The smallest decode batch: CPU GEMMs with fewer rows take other kernels, so a row's bits would
# depend on how many rows share its batch.
MIN_ROWS = 4
_CPU_ROWS_CHECKED = False
FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int ≥ 0, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be ≥ 1 or None (no top-k filter), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1] or be None (no nucleus filter), got {self.top_p}")
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))


@dataclass
class Completion:
    token_ids: list[int]  # exactly the sampled ids, the stop id included when one ended the row
    logprobs: list[float]  # each id's log-probability under the distribution it was sampled from
    model_logprobs: list[float]  # … under the untempered, unfiltered model
    finish_reason: str  # "stop" (a stop id) or "length" (max_new_tokens or the context ran out)


def context_length(model) -> int | None:
    """The longest sequence the model's profile trains on (its last stage), None if unknown."""
    name = getattr(model.cfg, "name", None)
    if name not in PROFILES:
        return None
    stages = get_profile(name).stages
    return max((s.seq_len for s in stages), default=None)


def _check_prompts(model, prompts: Sequence[Sequence[int]]) -> None:
    if len(prompts) == 0:
        raise ValueError("prompts is empty; pass a list of token-id lists")
    V, limit = model.cfg.vocab_size, context_length(model)
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty; start every prompt with at least one token (e.g. <|bos|>)")
        if limit is not None and len(prompt) > limit:
            raise ValueError(f"prompt {i} has {len(prompt)} tokens, more than the {model.cfg.name} profile's "
                             f"context of {limit}; shorten it")
        if min(prompt) < 0 or max(prompt) >= V:
            raise ValueError(f"prompt {i} holds ids outside [0, {V}); ids must come from the model's tokenizer")


def _per_row(cfg: SamplingConfig | Sequence[SamplingConfig], n: int) -> list[SamplingConfig]:
    if isinstance(cfg, SamplingConfig):
        return [cfg] * n
    cfgs = list(cfg)
    if len(cfgs) != n or not all(isinstance(c, SamplingConfig) for c in cfgs):
        raise ValueError(f"give one SamplingConfig, or one per prompt ({n}); got {len(cfgs)} items")
    return cfgs


def sample(logits_BV: torch.Tensor, cfgs: list[SamplingConfig], generator: torch.Generator | None = None,
           uniforms: Sequence[float] | None = None):
    """Draw one token per row. Returns (tokens [B], logprobs [B] under the sampling distribution,
    model_logprobs [B] under log_softmax(logits)), all computed in fp32.

    With `uniforms` (one u ∈ [0, 1) per row, read for sampled rows only) a row draws by inverse CDF,
    token = min{v : Σ_{w ≤ v} p_w > u · Σ_w p_w}, instead of from `generator`: each row's draw then
    depends on its own u alone, not on which rows share the batch (continuous batching,
    k3model/train/rollout.py). Every step is per row (softmax, cumsum, search), so a row gets the
    same bits in any batch."""
    logits_BV = logits_BV.float()
    B = logits_BV.shape[0]
    model_logp_BV = logits_BV.log_softmax(-1)
    tokens_B = logits_BV.argmax(-1)
    logp_B = torch.zeros(B, device=logits_BV.device)
    sampled = [b for b, c in enumerate(cfgs) if c.temperature > 0]
    if sampled:
        idx = torch.tensor(sampled, device=logits_BV.device)
        temps = torch.tensor([cfgs[b].temperature for b in sampled], device=logits_BV.device)
        z_SV = logits_BV.index_select(0, idx) / temps.unsqueeze(-1)
        if any(cfgs[b].top_k is not None or cfgs[b].top_p is not None for b in sampled):
            z_SV = _filter(z_SV, [cfgs[b] for b in sampled])
        dist_logp_SV = z_SV.log_softmax(-1)
        if uniforms is None:
            drawn_S = torch.multinomial(dist_logp_SV.exp(), 1, generator=generator).squeeze(-1)
        else:
            cdf_SV = z_SV.softmax(-1).cumsum(-1)
            u_S1 = torch.tensor([[float(uniforms[b])] for b in sampled], device=logits_BV.device)
            # right=True skips tokens of probability 0 (a flat CDF step); the clamp guards u·total
            # rounding onto the last step.
            drawn_S = torch.searchsorted(cdf_SV, u_S1 * cdf_SV[:, -1:], right=True).squeeze(-1).clamp_max(
                cdf_SV.shape[-1] - 1)
        tokens_B = tokens_B.index_copy(0, idx, drawn_S)
        logp_B = logp_B.index_copy(0, idx, dist_logp_SV.gather(-1, drawn_S.unsqueeze(-1)).squeeze(-1))
    model_logp_B = model_logp_BV.gather(-1, tokens_B.unsqueeze(-1)).squeeze(-1)
    return tokens_B, logp_B, model_logp_B


def _filter(z_SV: torch.Tensor, cfgs: list[SamplingConfig]) -> torch.Tensor:
    """Top-k, then top-p, per row: logits outside the kept set become −inf (the top token always stays)."""
    S, V = z_SV.shape
    sorted_SV, order_SV = z_SV.sort(-1, descending=True)
    rank_V = torch.arange(V, device=z_SV.device)
    k_S = torch.tensor([min(c.top_k or V, V) for c in cfgs], device=z_SV.device)
    drop_SV = rank_V.unsqueeze(0) >= k_S.unsqueeze(-1)
    p_S = torch.tensor([c.top_p if c.top_p is not None else 1.0 for c in cfgs], device=z_SV.device)
    probs_SV = sorted_SV.masked_fill(drop_SV, float("-inf")).softmax(-1)
    # Drop a token when the tokens ranked above it already reach top_p.
    before_SV = probs_SV.cumsum(-1) - probs_SV
    drop_SV |= (before_SV >= p_S.unsqueeze(-1)) & (p_S.unsqueeze(-1) < 1.0)
    drop_SV[:, 0] = False
    return z_SV.masked_fill(drop_SV.scatter(-1, order_SV, drop_SV), float("-inf"))


def last_logits(model, hidden_BTD: torch.Tensor) -> torch.Tensor:
    """The output head on each row's last position [B, V], computed over at least MIN_ROWS rows so a
    row's bits do not depend on how many rows were prefilled with it."""
    h_BD = hidden_BTD[:, -1]
    B = h_BD.shape[0]
    if B < MIN_ROWS:
        h_BD = torch.cat([h_BD, h_BD.new_zeros(MIN_ROWS - B, h_BD.shape[1])])
    return model.lm_head(model.final_norm(h_BD))[:B]


@torch.no_grad()
def prefill(model, prompts: Sequence[Sequence[int]], capacity: int, images=None, max_batch_tokens: int = 8192):
    """Prompts through the model's chunked forward; returns (cache with one row per prompt, logits of
    each prompt's last position [B, V]). Identical prompts (with no images) are prefilled once and
    forked; distinct prompts of one length (≥ MIN_ROWS tokens) share forwards of at most
    max_batch_tokens tokens, which gives each row what it gets alone (its own positions, ≥ 4 GEMM
    rows); the rest go alone."""
    device = next(model.parameters()).device
    first: dict[tuple, int] = {}
    unique, row_of = [], []
    for i, prompt in enumerate(prompts):
        key = (tuple(prompt),) if images is None or images[i] is None else (i,)
        if key not in first:
            first[key] = len(unique)
            unique.append(i)
        row_of.append(first[key])
    batches: dict[object, list[int]] = {}
    for u, i in enumerate(unique):
        with_image = images is not None and images[i] is not None
        # A prompt shorter than MIN_ROWS goes alone: its GEMMs would have fewer than 4 rows alone and
        # more in a batch (other kernels, other bits).
        alone = with_image or len(prompts[i]) < MIN_ROWS
        batches.setdefault(("alone", u) if alone else len(prompts[i]), []).append(u)
    caches, logits, order = [], [], []
    for members in batches.values():
        T = len(prompts[unique[members[0]]])
        per = max(1, max_batch_tokens // T)
        for at in range(0, len(members), per):
            part = members[at: at + per]
            ids_BT = torch.tensor([list(prompts[unique[u]]) for u in part], device=device)
            cache = ModelCache.empty(model, len(part), capacity=T + capacity)
            i = unique[part[0]]
            if images is not None and images[i] is not None:
                images_NCHW, mask_T = images[i]
                out = model(ids_BT, images_NCHW, mask_T.unsqueeze(0).to(device), cache=cache, logits=False)
            else:
                out = model(ids_BT, cache=cache, logits=False)
            caches.append(out.cache)
            logits.append(last_logits(model, out.hidden_BTD))
            order += part
    cache = caches[0] if len(caches) == 1 else ModelCache.cat(caches)
    logits_UV = torch.cat(logits)
    # Rows are in batch order; put prompt i's row at i.
    position = {u: b for b, u in enumerate(order)}
    rows = [position[u] for u in row_of]
    if rows != list(range(len(rows))):
        cache = cache.select(rows)
        logits_UV = logits_UV[torch.tensor(rows, device=device)]
    return cache, logits_UV


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], cfg: SamplingConfig | Sequence[SamplingConfig], *,
             generator: torch.Generator | None = None, images=None) -> list[Completion]:
    """Decode every prompt (lists of token ids of any lengths) as one batch; see the module docstring.

    `cfg` is one SamplingConfig or one per prompt (per-row stop ids, lengths and sampling).
    `images`, if given, holds per prompt None or (images_NCHW, image_mask_T) as K3Model takes them.
    """
    cfgs = _per_row(cfg, len(prompts))
    _check_prompts(model, prompts)
    _check_cpu_rows(model)
    if images is not None and len(images) != len(prompts):
        raise ValueError(f"images must hold one entry (None or (images, mask)) per prompt, got {len(images)}")
    limit = context_length(model)
    budgets = [c.max_new_tokens if limit is None else min(c.max_new_tokens, limit - len(p))
               for c, p in zip(cfgs, prompts)]
    completions = [Completion([], [], [], FINISH_LENGTH) for _ in prompts]
    live = [i for i, n in enumerate(budgets) if n > 0]
    if not live:
        return completions
    was_training = model.training
    model.eval()
    try:
        cache, logits_BV = prefill(model, [prompts[i] for i in live], max(budgets),
                                   None if images is None else [images[i] for i in live])
        done, _ = decode(model, cache, logits_BV, [cfgs[i] for i in live], [budgets[i] for i in live],
                         generator=generator)
    finally:
        model.train(was_training)
    for i, completion in zip(live, done):
        completions[i] = completion
    return completions


def _check_cpu_rows(model) -> None:
    """Warn once per process if this CPU's GEMMs give a row other bits at other row counts (MKL
    outside its strict mode, which k3model/__init__.py sets before any matmul runs): batched decoding
    then stays correct but no longer equals each row decoded alone."""
    global _CPU_ROWS_CHECKED
    if _CPU_ROWS_CHECKED or next(model.parameters()).device.type != "cpu":
        return
    _CPU_ROWS_CHECKED = True
    generator = torch.Generator().manual_seed(0)
    w_OI, x_MI = torch.randn(128, 128, generator=generator), torch.randn(64, 128, generator=generator)
    first = torch.nn.functional.linear(x_MI[:MIN_ROWS], w_OI)[0]
    if not all(torch.equal(torch.nn.functional.linear(x_MI[:m], w_OI)[0], first) for m in range(MIN_ROWS, 65)):
        warnings.warn("this CPU's matmuls give a row other bits beside other rows (was a CPU matmul run "
                      "before k3model was imported? MKL's strict mode is then off): a batched decode will not equal "
                      "each row decoded alone bitwise", RuntimeWarning, stacklevel=3)


def _record(done: Completion, token: int, logp: float, model_logp: float, cfg: SamplingConfig, budget: int) -> bool:
    """Append one sampled token to its completion; True when the row has finished."""
    done.token_ids.append(token)
    done.logprobs.append(logp)
    done.model_logprobs.append(model_logp)
    if token in cfg.stop_ids:
        done.finish_reason = FINISH_STOP
        return True
    return len(done.token_ids) >= budget


@torch.no_grad()
def decode(model, cache: ModelCache, logits_BV: torch.Tensor, cfgs: list[SamplingConfig], budgets: list[int], *,
           generator: torch.Generator | None = None, keep_caches: bool = False):
    """The decode loop: row b of `cache` continues from `logits_BV[b]` (the logits after its last
    fed token) for at most budgets[b] ≥ 1 new tokens. Returns (completions, and with keep_caches
    each row's final cache: one row, holding every sampled token but the last, which was never fed)."""
    if cache.layers and _on_cuda(cache) and not keep_caches and _capturable(model):
        return _decode_graphed(model, cache, logits_BV, cfgs, budgets, generator), None
    B = cache.batch
    completions = [Completion([], [], [], FINISH_LENGTH) for _ in range(B)]
    final: list[ModelCache | None] = [None] * B
    rows = list(range(B))  # the completion each batch row decodes; −1 marks padding rows
    if B < MIN_ROWS:
        pad = [0] * (MIN_ROWS - B)
        cache = cache.select(rows + pad)
        logits_BV = torch.cat([logits_BV, logits_BV[pad]])
        rows += [-1] * len(pad)
    greedy = SamplingConfig(max_new_tokens=0)
    while True:
        row_cfgs = [cfgs[r] if r >= 0 else greedy for r in rows]
        tokens_B, logp_B, model_logp_B = sample(logits_BV, row_cfgs, generator)
        tokens, logps, model_logps = tokens_B.tolist(), logp_B.tolist(), model_logp_B.tolist()
        keep = []
        for b, r in enumerate(rows):
            if r < 0:
                continue
            if not _record(completions[r], tokens[b], logps[b], model_logps[b], cfgs[r], budgets[r]):
                keep.append(b)
                continue
            if keep_caches:
                final[r] = cache.select([b])
        if not keep:
            return completions, (final if keep_caches else None)
        if len(keep) < len(rows):
            # Finished rows leave; finished or padding rows fill the batch back to MIN_ROWS.
            spare = [b for b in range(len(rows)) if b not in keep][: max(0, MIN_ROWS - len(keep))]
            order = keep + spare
            cache = cache.select(order)
            tokens_B = tokens_B[torch.tensor(order, device=tokens_B.device)]
            rows = [rows[b] for b in keep] + [-1] * len(spare)
        logits_BV = model(tokens_B.unsqueeze(1), cache=cache).logits_BTV[:, 0]


@torch.no_grad()
def score(model, sequences: Sequence[Sequence[int]], prompt_lens: Sequence[int], *,
          max_batch_tokens: int = 8192) -> list[list[float]]:
    """Teacher-forced log-probabilities (fp32) of each sequence's tokens after its first prompt_len,
    through the training forward (no cache: chunked KDA). Sequences of different lengths are padded
    on the right, which a causal model never sees from earlier positions; batches hold at most
    `max_batch_tokens` padded tokens (one sequence at least)."""
    if len(sequences) != len(prompt_lens):
        raise ValueError(f"give one prompt_len per sequence: {len(sequences)} sequences, {len(prompt_lens)} lengths")
    _check_prompts(model, sequences)
    for i, (seq, p) in enumerate(zip(sequences, prompt_lens)):
        if not 1 <= p <= len(seq):
            raise ValueError(f"prompt_lens[{i}] = {p} must lie in [1, {len(seq)}] (the first token has no "
                             "log-probability)")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[list[float]] = [[] for _ in sequences]
    try:
        start = 0
        while start < len(sequences):
            end = start + 1
            while end < len(sequences) and (end + 1 - start) * max(len(s) for s in sequences[start:end + 1]) <= max_batch_tokens:
                end += 1
            batch = list(range(start, end))
            T = max(len(sequences[i]) for i in batch)
            ids_BT = torch.zeros(len(batch), T, dtype=torch.long, device=device)
            for b, i in enumerate(batch):
                ids_BT[b, : len(sequences[i])] = torch.tensor(list(sequences[i]), device=device)
            logits_BTV = model(ids_BT).logits_BTV
            for b, i in enumerate(batch):
                n, p = len(sequences[i]), prompt_lens[i]
                logp_NV = logits_BTV[b, p - 1: n - 1].float().log_softmax(-1)
                out[i] = logp_NV.gather(-1, ids_BT[b, p:n].unsqueeze(-1)).squeeze(-1).tolist()
            start = end
    finally:
        model.train(was_training)
    return out


def _on_cuda(cache: ModelCache) -> bool:
    return cache.tensors()[0].is_cuda


def _capturable(model) -> bool:
    """Whether a decode step of `model` can be captured in a CUDA graph: its routed experts run
    torch._grouped_mm, whose kernel is bf16; for other dtypes the op falls back to a loop that reads
    the expert offsets on the host, which a capture forbids. fp32 models decode eagerly."""
    return next(model.parameters()).dtype == torch.bfloat16 or torch.is_autocast_enabled("cuda")


_CAPTURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def capacity_bucket(tokens: int) -> int:
    """The static capacity a captured graph is built for: `tokens` rounded up to a power of two (≥ 64),
    so calls of similar lengths share one graph."""
    return max(64, 1 << (tokens - 1).bit_length())


def reused(model, key: tuple, build: Callable, *owners) -> object:
    """build() once per (model, key) and return the same object while every parameter and buffer of
    `owners` stays at the address it had then (a captured graph reads the weights by address: in-place
    updates such as an optimizer step are seen, replaced tensors such as .to(dtype) are not, so
    those trigger a new capture; so do fused projections made or freed, k3model/fused.py, and a QAT
    model's frozen expert stacks, k3model/train/qat.py). Kept for as long as `model` lives."""
    addresses = tuple(t.data_ptr() for owner in owners for t in (*owner.parameters(), *owner.buffers()))
    per_model = _CAPTURED.setdefault(model, {})
    hit = per_model.get(key)
    if hit is not None and hit[0] == addresses:
        return hit[1]
    built = build()
    per_model[key] = (addresses, built)
    return built


class GraphStep:
    """One decode step of `model` over a static cache (k3model/cache.py), captured in a CUDA graph:
    fixed batch and capacity, every update in place, no host synchronisation inside. Call it with
    the batch's next tokens [B]; it returns the logits [B, V] (a buffer the next call overwrites)."""

    @torch.no_grad()
    def __init__(self, model, cache: ModelCache):
        if not cache.static:
            raise ValueError("GraphStep needs a static cache: use cache.to_static(capacity)")
        self.cache = cache
        self.tokens_B1 = torch.zeros(cache.batch, 1, dtype=torch.long, device=cache.tensors()[0].device)
        # Warm-up and capture run the step, which writes the cache and advances its lengths: the
        # state is put back after each run, so all three write at the same position and a cache
        # with room for one more token is enough.
        saved, lengths = [t.clone() for t in cache.tensors()], list(cache.lengths)

        def restore() -> None:
            for t, s in zip(cache.tensors(), saved):
                t.copy_(s)
            cache.lengths = list(lengths)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model(self.tokens_B1, cache=cache)
                restore()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits_BV = model(self.tokens_B1, cache=cache).logits_BTV[:, 0]
        restore()

    @torch.no_grad()
    def __call__(self, tokens_B: torch.Tensor) -> torch.Tensor:
        self.tokens_B1.copy_(tokens_B.view(-1, 1))
        self.graph.replay()
        self.cache.lengths = [n + 1 for n in self.cache.lengths]
        return self.logits_BV


def _decode_graphed(model, cache: ModelCache, logits_BV, cfgs, budgets, generator) -> list[Completion]:
    """decode() on CUDA: the same loop over a captured step; finished rows ride along to the end."""
    B = cache.batch
    step = None  # captured when a row needs a second token
    completions = [Completion([], [], [], FINISH_LENGTH) for _ in range(B)]
    live = set(range(B))
    while True:
        tokens_B, logp_B, model_logp_B = sample(logits_BV, cfgs, generator)
        tokens, logps, model_logps = tokens_B.tolist(), logp_B.tolist(), model_logp_B.tolist()
        for b in list(live):
            if _record(completions[b], tokens[b], logps[b], model_logps[b], cfgs[b], budgets[b]):
                live.discard(b)
        if not live:
            return completions
        if step is None:
            capacity = capacity_bucket(max(n + b for n, b in zip(cache.lengths, budgets)))
            step = reused(model, ("decode", B, capacity), lambda: GraphStep(model, cache.to_static(capacity)), model)
            step.cache.load(cache)
        logits_BV = step(tokens_B)


class SlotBatch:
    """A decode batch of `rows` slots that episodes join and leave between steps (continuous
    batching, k3model/train/rollout.py). A one-row cache joins a free slot by being copied into it,
    in place; a row leaves by being copied out (a one-row dynamic cache holding what it was fed);
    free slots ride along on a dummy token, with length 1 (MLA then attends one finite entry). Each
    event copies one row's state, never the batch's.

    On the CPU (or an fp32 model) the cache is dynamic and each step is the model's forward; with
    rows ≥ MIN_ROWS a live row gets the bits it gets alone (the engine's batch invariance: MLA
    attends per group of rows of equal length, the GEMMs see ≥ 4 rows). On CUDA with a capturable
    model the cache is static (capacity rounded up to a power of two, grown by a new capture when a
    joining row needs more) and each step replays a captured `GraphStep`, reused across calls for
    the same model, rows and capacity (`reused`)."""

    def __init__(self, model, rows: int, graphed: bool | None = None):
        if rows < MIN_ROWS:
            raise ValueError(f"a SlotBatch needs at least MIN_ROWS = {MIN_ROWS} rows (batch invariance), got {rows}")
        param = next(model.parameters())
        self.model, self.rows = model, rows
        self.graphed = (param.is_cuda and _capturable(model)) if graphed is None else graphed
        self.live = [False] * rows
        self.step_fn: GraphStep | None = None
        self.cache: ModelCache | None = None
        if not self.graphed:
            self.cache = ModelCache.empty(model, rows, capacity=64)
            self.cache.lengths = [1] * rows
        # (graphed: captured at the first join, at the capacity that row needs)
        self._lengths_dirty = False

    def _capture(self, capacity: int) -> None:
        """(Re)build the static cache at `capacity` and its captured step, keeping the live rows."""
        model, rows, old = self.model, self.rows, self.cache
        def build():
            blank = ModelCache.empty(model, rows, capacity=capacity)
            blank.lengths = [1] * rows
            return GraphStep(model, blank.to_static(capacity))
        self.step_fn = reused(model, ("slots", rows, capacity), build, model)
        cache = self.step_fn.cache
        if old is not None:
            for mine, theirs in zip(cache.layers, old.layers):
                if isinstance(mine, KDAState):
                    for name in _KDA_FIELDS:
                        getattr(mine, name).copy_(getattr(theirs, name))
                else:
                    n = min(theirs.buffer_BSL.shape[1], capacity)
                    mine.buffer_BSL[:, :n].copy_(theirs.buffer_BSL[:, :n])
            cache.lengths = list(old.lengths)
        else:
            cache.lengths = [1] * rows
        cache.lengths_B.copy_(torch.tensor(cache.lengths))
        self.cache = cache

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else self.cache.capacity

    def free(self) -> list[int]:
        return [b for b, on in enumerate(self.live) if not on]

    def join(self, row: ModelCache, need: int) -> int:
        """Copy a one-row dynamic cache into a free slot; `need` is the most tokens the row may hold
        before it leaves again (its length + its turn's budget). Returns the slot."""
        if row.batch != 1 or row.static:
            raise ValueError("join() takes a one-row dynamic cache")
        b = self.free()[0]
        n = row.lengths[0]
        if self.graphed and need > self.capacity:
            self._capture(capacity_bucket(need))
        cache = self.cache
        for i, (mine, theirs) in enumerate(zip(cache.layers, row.layers)):
            if isinstance(mine, KDAState):
                for name in _KDA_FIELDS:
                    target = getattr(mine, name)
                    if not target.is_contiguous():  # a forward's view: own it before writing a row
                        target = target.contiguous()
                        setattr(mine, name, target)
                    target[b].copy_(getattr(theirs, name)[0])
            else:
                if n > mine.buffer_BSL.shape[1]:  # dynamic only: the static capacity was checked above
                    grown = mine.buffer_BSL.new_zeros(self.rows, max(n + 64, 2 * mine.buffer_BSL.shape[1]),
                                                      mine.buffer_BSL.shape[2])
                    grown[:, : mine.buffer_BSL.shape[1]] = mine.buffer_BSL
                    mine.buffer_BSL = grown
                mine.buffer_BSL[b, :n].copy_(theirs.buffer_BSL[0, :n])
        cache.lengths[b] = n
        self.live[b] = True
        self._lengths_dirty = True
        return b

    def leave(self, b: int) -> ModelCache:
        """Free slot b; returns its row as a one-row dynamic cache (every token it was fed)."""
        cache, n = self.cache, self.cache.lengths[b]
        layers = []
        for layer in cache.layers:
            if isinstance(layer, KDAState):
                layers.append(KDAState(*(getattr(layer, name)[b: b + 1].clone() for name in _KDA_FIELDS)))
            else:
                # Room for the next observation, so feeding it does not grow (zero and copy) the
                # buffer; entries past the length are never read by a dynamic cache.
                row = layer.buffer_BSL.new_empty(1, n + LEAVE_ROOM, layer.buffer_BSL.shape[2])
                row[:, :n] = layer.buffer_BSL[b: b + 1, :n]
                layers.append(LatentCache(row, None))
        self.live[b] = False
        cache.lengths[b] = 1
        self._lengths_dirty = True
        return ModelCache(layers, [n], cache.model_id)

    def shrink(self, rows: int) -> list[int] | None:
        """Keep max(rows, MIN_ROWS) slots, the live ones first, in their order; returns the old slot of
        each new one (None, and nothing done, when there would be no fewer slots)."""
        rows = max(MIN_ROWS, rows)
        live = [b for b, on in enumerate(self.live) if on]
        if rows >= self.rows or len(live) > rows:
            return None
        order = live + [b for b in range(self.rows) if not self.live[b]][: rows - len(live)]
        if self.graphed:
            kept = [self.leave(b) for b in live]
            self.rows, self.live = rows, [False] * rows
            old_cap, self.cache = self.capacity, None
            self._capture(old_cap)
            for row in kept:
                self.join(row, row.lengths[0])
        else:
            self.cache = self.cache.select(order)
            self.rows, self.live = rows, [b < len(live) for b in range(rows)]
        self._lengths_dirty = True
        return order

    def step(self, tokens_B: torch.Tensor) -> torch.Tensor:
        """Feed one token per slot (free slots: anything); the logits [rows, V] after it (on CUDA a
        buffer the next step overwrites)."""
        cache = self.cache
        for b, on in enumerate(self.live):
            if not on and cache.lengths[b] != 1:
                cache.lengths[b] = 1
                self._lengths_dirty = True
        if self.graphed:
            if self._lengths_dirty:
                cache.lengths_B.copy_(torch.tensor(cache.lengths))
            self._lengths_dirty = False
            return self.step_fn(tokens_B)
        self._lengths_dirty = False
        return self.model(tokens_B.unsqueeze(1), cache=cache).logits_BTV[:, 0]


_KDA_FIELDS = ("conv_q", "conv_k", "conv_v", "recurrent")
LEAVE_ROOM = 512  # MLA entries a row that leaves a SlotBatch gets beyond its length
