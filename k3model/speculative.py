"""Lossless speculative decoding: a draft proposes a chain of tokens, the target checks them in one
forward (Leviathan et al. 2023, Chen et al. 2023; EAGLE's `ea_model.py` loop beside `cnets.py`;
research/recipe.md §4(c), research/posttrain-anchors.md §5).

One round, the target's cache holding x_0 … x_{n−1} and x_n drawn but not yet fed:
    the draft proposes d_1 … d_k, each d_j ~ q_j (argmax q_j when greedy), q_j = q(· | x_≤n, d_<j)
    the target runs [x_n, d_1, …, d_k] once → p_1 … p_{k+1}, p_j = p(· | x_≤n, d_<j)
    sampling:  accept d_j with probability min(1, p_j(d_j) / q_j(d_j)), in order;
               at the first rejection emit y ~ norm(max(0, p_j − q_j)) and stop;
               when all k are accepted emit a bonus y ~ p_{k+1}
    greedy:    accept while d_j = argmax p_j, then emit y = argmax p at the first mismatch (or the bonus)
    the target's cache rolls back to x_≤n, d_≤a (KDA states, conv windows, MLA lengths:
    ModelCache.rollback), the draft's to before its chain, and the draft re-reads the target's true
    features of the accepted positions.

Why it is exact: for each d, P(emit d at step j) = q_j(d) · min(1, p_j(d)/q_j(d)) + P(reject) ·
norm(max(0, p_j − q_j))(d) = min(q_j(d), p_j(d)) + max(0, p_j(d) − q_j(d)) = p_j(d), and each step
conditions on the tokens emitted before it, so every emitted sequence has the target's probability
whatever the draft (tests/k3model/test_speculative.py enumerates it). q is the draft's real
distribution — the same temperature, top-k and top-p as the target's — not a one-hot of its argmax
as in vLLM and EAGLE, which raises acceptance when sampling.

p is the engine's sampling distribution (k3model/engine.py: softmax(logits / temperature) after
top-k and top-p), so the output follows exactly what `generate` samples from. Greedy output is the
target's greedy output as long as the verify forward's argmax equals the decode step's: it feeds
k + 1 tokens at once, which differs from one-token steps by GEMM rounding (k3model/cache.py), so a
near tie between the top two logits could in principle flip (docs/log/speculative.md counts it).
One prompt at a time (batch 1). A round's chain may end before K drafts (`min_draft_prob`: after a
draft the draft itself gives less than that), which reads only the draft's side and so changes
nothing of the above. On the CPU the verify runs KDA's recurrence over its K + 1 tokens in one C
call and rebuilds the state of the last accepted position only when rolling back to it
(kda_layer.VerifyPositions); the draft computes its head on the last position only.

On CUDA, greedy with a fixed chain (min_draft_prob None) and a bf16 target (engine._capturable),
a whole round is one captured CUDA graph (`GreedyRound`): the K − 1 draft steps, the verify, the
accepted count a = the length of the agreeing prefix, both caches' rollback (static caches,
ModelCache.keep) and the draft's re-read of the kept positions all run on the device, and the host
reads K + 2 integers a round. Every round drafts K (the budget's last round too; the tokens past
the budget are dropped), and it needs no host decision: the tokens a round emits, t_0 … t_a, are
the target's own argmaxes, so the draft re-reads the verify's argmax row as it is. Its output is the
plain greedy output bitwise on the H200 with eager modules (bf16 GEMMs there give a row the same bits
at any row count; the router's fp32 GEMM and KDA's recurrence are made to: moe.ROUTER_MIN_ROWS,
kernels/kda/decode.py). With compiled regions (k3model/compiled.py) it is not: Inductor's kernels for
K + 1 tokens round otherwise than the one-token step's, and near ties flip tokens (a warning says so;
docs/log/deploy.md).
Legend: K draft length, V vocabulary, T tokens, D width.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Sequence

import torch

from k3model.cache import ModelCache
from k3model.draft import DraftModel, check_draft, target_features
from k3model.kda_layer import KDAState
from k3model.engine import (SamplingConfig, _capturable, _check_prompts, _filter, capacity_bucket, context_length,
                            last_logits, reused)


@dataclass
class SpeculativeStats:
    """What one speculative_generate call did. A round is one draft chain and one target verify."""
    draft_len: int
    rounds: int = 0  # rounds with at least one draft (the last round may draft fewer than draft_len)
    drafted: int = 0
    accepted: int = 0
    reached_at_depth: list[int] = field(default_factory=list)  # rounds whose j-th draft was checked
    accepted_at_depth: list[int] = field(default_factory=list)  # … and accepted (conditional on the earlier)
    target_forwards: int = 0  # prefill and every verify, a budget-tail round without drafts included

    @property
    def acceptance_length(self) -> float:
        """τ: tokens emitted per drafting round, accepted drafts + the corrected or bonus token
        (EAGLE's convention, #195); 0.0 when no round drafted."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def acceptance_by_depth(self) -> list[float]:
        """P(draft j accepted | drafts < j accepted), per depth j (the conditional n-α, EAGLE #191)."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_at_depth, self.reached_at_depth)]

    def as_dict(self) -> dict:
        return {"draft_len": self.draft_len, "rounds": self.rounds, "drafted": self.drafted,
                "accepted": self.accepted, "acceptance_length": self.acceptance_length,
                "acceptance_by_depth": self.acceptance_by_depth, "target_forwards": self.target_forwards}


# --- the pure acceptance rule --------------------------------------------------------------------

def sampling_probs(logits_TV: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution `generate` samples from, per row, fp32 [T, V] (temperature > 0)."""
    z_TV = logits_TV.float() / cfg.temperature
    if cfg.top_k is not None or cfg.top_p is not None:
        z_TV = _filter(z_TV, [cfg] * z_TV.shape[0])
    return z_TV.softmax(-1)


def acceptance_probs(p_KV: torch.Tensor, q_KV: torch.Tensor, drafts_K: torch.Tensor) -> torch.Tensor:
    """min(1, p_j(d_j) / q_j(d_j)) per draft [K]. d_j was drawn from q_j, so q_j(d_j) > 0."""
    p_K = p_KV.gather(-1, drafts_K.unsqueeze(-1)).squeeze(-1)
    q_K = q_KV.gather(-1, drafts_K.unsqueeze(-1)).squeeze(-1)
    return torch.clamp(p_K / q_K, max=1.0)


def residual(p_V: torch.Tensor, q_V: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)): what a rejection samples from. Rejection has probability
    Σ max(0, p − q), which is 0 when p = q; if rounding still lands there, p itself is returned."""
    r_V = torch.clamp(p_V - q_V, min=0.0)
    total = r_V.sum()
    return r_V / total if total > 0 else p_V


def verify_sampled(p_K1V: torch.Tensor, q_KV: torch.Tensor, drafts_K: torch.Tensor,
                   generator: torch.Generator | None = None) -> tuple[int, int]:
    """The exact rule on one chain: p_K1V the target's distributions after each of the k drafts'
    prefixes and after all of them (k + 1 rows), q_KV the draft's for each draft. Returns
    (a, y): the first a drafts are accepted and y follows them (a residual sample, or the bonus
    from p_{k+1} when a = k)."""
    K = drafts_K.shape[0]
    if K == 0:
        return 0, int(torch.multinomial(p_K1V[0], 1, generator=generator))
    accept_K = acceptance_probs(p_K1V[:K], q_KV, drafts_K)
    u_K = torch.rand(K, generator=generator, device=p_K1V.device)
    for j in range(K):
        if not u_K[j] < accept_K[j]:
            y = torch.multinomial(residual(p_K1V[j], q_KV[j]), 1, generator=generator)
            return j, int(y)
    return K, int(torch.multinomial(p_K1V[K], 1, generator=generator))


def verify_greedy(target_ids_K1: Sequence[int], drafts: Sequence[int]) -> tuple[int, int]:
    """Greedy verification: a = the length of the longest prefix where d_j = argmax p_j, and
    y = argmax p_{a+1} (EAGLE's `evaluate_posterior`, the cumulative product of matches)."""
    a = 0
    while a < len(drafts) and drafts[a] == target_ids_K1[a]:
        a += 1
    return a, int(target_ids_K1[a])


# --- the decode loop ----------------------------------------------------------------------------

def _pick(logits_TV: torch.Tensor, cfg: SamplingConfig, generator) -> tuple[list[int], torch.Tensor | None]:
    """Tokens from each row (argmax when greedy, else drawn) and the distributions (None if greedy)."""
    if cfg.temperature == 0:
        return logits_TV.float().argmax(-1).tolist(), None
    probs_TV = sampling_probs(logits_TV, cfg)
    return torch.multinomial(probs_TV, 1, generator=generator).squeeze(-1).tolist(), probs_TV


def _draft_prob(logits_1V: torch.Tensor, q_1V: torch.Tensor | None, d: int) -> float:
    """q(d): the draft's probability of its draft d (its softmax when greedy, where q_1V is None)."""
    if q_1V is None:
        return float(logits_1V[0].float().softmax(-1)[d])
    return float(q_1V[0, d])


@torch.no_grad()
def speculative_generate(target, draft: DraftModel, prompt_ids: Sequence[int], cfg: SamplingConfig,
                         draft_len: int, *, generator: torch.Generator | None = None,
                         min_draft_prob: float | None = None) -> tuple[list[int], SpeculativeStats]:
    """Decode `prompt_ids` (one prompt, a list of token ids) with `target`, `draft` proposing up to
    `draft_len` tokens a round; see the module docstring. Returns (the new token ids, the stop id
    included when one ended the output, exactly as `generate` would; SpeculativeStats).

    `min_draft_prob`: end a round's chain early after a draft whose probability under the draft
    (q(d), softmax of its logits when greedy) is below this (EAGLE-2's dynamic draft, as a chain): a
    draft the draft itself doubts is rarely accepted, and the drafts after it never are. The rule
    reads only the draft's side, so the output keeps the target's distribution (greedy: its output)."""
    if not isinstance(draft_len, int) or draft_len < 1:
        raise ValueError(f"draft_len must be an int ≥ 1 (the drafts per round), got {draft_len!r}; "
                         "use engine.generate for plain decoding")
    if min_draft_prob is not None and not 0 <= min_draft_prob <= 1:
        raise ValueError(f"min_draft_prob must lie in [0, 1] or be None (always draft draft_len), got {min_draft_prob}")
    check_draft(target, draft)
    if any(isinstance(t, (list, tuple)) for t in prompt_ids):
        raise ValueError("speculative_generate takes one prompt (a list of ids); call it once per prompt")
    prompt_ids = [int(t) for t in prompt_ids]
    _check_prompts(target, [prompt_ids])
    limit = context_length(target)
    budget = cfg.max_new_tokens if limit is None else min(cfg.max_new_tokens, limit - len(prompt_ids))
    stats = SpeculativeStats(draft_len, reached_at_depth=[0] * draft_len, accepted_at_depth=[0] * draft_len)
    if budget <= 0:
        return [], stats
    device = next(target.parameters()).device
    # Only flip modes that need it: .eval() walks every module, a cost per call at small sizes.
    training = [m for m in (target, draft) if m.training]
    for m in training:
        m.eval()
    try:
        if device.type == "cuda" and cfg.temperature == 0 and min_draft_prob is None and _capturable(target):
            if any(getattr(m, "_compiled_region", False) for m in target.modules()):
                warnings.warn("the target has compiled regions: greedy speculative output may differ from its "
                              "plain greedy output (Inductor rounds a K + 1-token verify otherwise than a "
                              "one-token step); decode with eager modules for lossless output", stacklevel=2)
            return _decode_static(target, draft, prompt_ids, cfg, draft_len, budget, stats, capture=True), stats
        return _decode(target, draft, prompt_ids, cfg, draft_len, budget, generator, stats, device,
                       min_draft_prob), stats
    finally:
        for m in training:
            m.train()


def _decode(target, draft, prompt, cfg, draft_len, budget, generator, stats, device, min_draft_prob) -> list[int]:
    n = len(prompt)
    capacity = n + budget + draft_len + 1
    target_cache = ModelCache.empty(target, 1, capacity=capacity, max_rollback=draft_len + 1)
    draft_cache = ModelCache.empty(draft, 1, capacity=capacity, max_rollback=draft_len + 1)
    ids = lambda tokens: torch.tensor([tokens], device=device)  # noqa: E731
    with target_features(target, draft) as seen:
        out = target(ids(prompt), cache=target_cache, logits=False)
        stats.target_forwards += 1
        f_1TD = draft.fuse_features([seen["low"], seen["mid"], out.hidden_BTD])
        first, _ = _pick(last_logits(target, out.hidden_BTD), cfg, generator)
        emitted = first
        if budget == 1 or emitted[-1] in cfg.stop_ids:
            return emitted
        # The draft reads (f_i, x_{i+1}) for every prompt position, the last pair with the first new token.
        g_1TD, draft_logits_1TV = draft(f_1TD, ids(prompt[1:] + emitted), draft_cache, last_only=True)
        while True:
            k = min(draft_len, budget - len(emitted) - 1)
            draft_start = draft_cache.length
            drafts, q_rows = [], []
            h_11D, logits_1V = g_1TD[:, -1:], draft_logits_1TV[0, -1:]
            for j in range(k):
                (d,), q_1V = _pick(logits_1V, cfg, generator)
                drafts.append(d)
                if q_1V is not None:
                    q_rows.append(q_1V[0])
                if j == k - 1 or (min_draft_prob is not None and _draft_prob(logits_1V, q_1V, d) < min_draft_prob):
                    break
                h_11D, step_logits = draft(h_11D, ids([d]), draft_cache)
                logits_1V = step_logits[0]
            k = len(drafts)

            start = target_cache.length
            out = target(ids([emitted[-1]] + drafts), cache=target_cache)
            stats.target_forwards += 1
            logits_TV = out.logits_BTV[0]
            if cfg.temperature == 0:
                a, y = verify_greedy(logits_TV.float().argmax(-1).tolist(), drafts)
            else:
                q_KV = torch.stack(q_rows) if k else logits_TV.new_zeros(0, logits_TV.shape[-1])
                a, y = verify_sampled(sampling_probs(logits_TV, cfg), q_KV,
                                      torch.tensor(drafts, device=device, dtype=torch.long), generator)
            if k:
                stats.rounds += 1
                stats.drafted += k
                stats.accepted += a
                for j in range(min(a + 1, k)):
                    stats.reached_at_depth[j] += 1
                    stats.accepted_at_depth[j] += j < a
            if a < k:
                target_cache.rollback(start + 1 + a)
            new = drafts[:a] + [y]
            emitted = emitted + new
            if len(emitted) >= budget or any(t in cfg.stop_ids for t in new):
                break
            # The draft forgets its own chain and reads the target's features of what was kept.
            if draft_cache.length != draft_start:
                draft_cache.rollback(draft_start)
            f_1TD = draft.fuse_features([seen["low"][:, : a + 1], seen["mid"][:, : a + 1], out.hidden_BTD[:, : a + 1]])
            g_1TD, draft_logits_1TV = draft(f_1TD, ids(new), draft_cache, last_only=True)
    for i, t in enumerate(emitted):
        if t in cfg.stop_ids:
            return emitted[: i + 1]
    return emitted[:budget]


# --- greedy rounds on the device (CUDA graphs) ---------------------------------------------------

class GreedyRound:
    """One greedy round of a fixed chain of K drafts over static caches with no host synchronisation,
    replayed as one CUDA graph when `capture` (see the module docstring). Before the first call,
    `start` gives it the last emitted token (not yet fed to the target), the draft's output g at the
    position before it and the draft's first draft. Each call returns (t_0 … t_K, the target's argmax
    after each fed token, and a, how many drafts it accepted); the round has already kept t_0 … t_a
    in both caches and set up the next round."""

    @torch.no_grad()
    def __init__(self, target, draft: DraftModel, target_cache: ModelCache, draft_cache: ModelCache,
                 seen: dict, draft_len: int, capture: bool):
        K = draft_len
        if target_cache.max_tokens < K + 1 or draft_cache.max_tokens < K + 1:
            raise ValueError(f"both caches must take K + 1 = {K + 1} tokens a forward (to_static(..., max_tokens))")
        if any(isinstance(layer, KDAState) for layer in draft_cache.layers):
            raise ValueError("the draft's cache must hold MLA layers only: its chain is forgotten by length alone")
        self.target, self.draft, self.K, self.seen = target, draft, K, seen
        self.target_cache, self.draft_cache = target_cache, draft_cache
        device = target_cache.tensors()[0].device
        self.last_1 = torch.zeros(1, dtype=torch.long, device=device)
        self.first_1 = torch.zeros(1, dtype=torch.long, device=device)
        self.h_11D = torch.zeros(1, 1, draft.cfg.d_model, dtype=next(draft.parameters()).dtype, device=device)
        self.result_K2 = torch.zeros(K + 2, dtype=torch.long, device=device)  # t_0 … t_K, a
        self.graph = self._capture() if capture else None

    def _state(self) -> list[torch.Tensor]:
        return self.target_cache.tensors() + self.draft_cache.tensors() + [self.last_1, self.first_1, self.h_11D]

    def _capture(self) -> torch.cuda.CUDAGraph:
        # Warm-up and capture run a round, which writes the caches: put everything back after each.
        saved = [t.clone() for t in self._state()]
        lengths = (list(self.target_cache.lengths), list(self.draft_cache.lengths))

        def restore() -> None:
            for t, s in zip(self._state(), saved):
                t.copy_(s)
            self.target_cache.lengths, self.draft_cache.lengths = list(lengths[0]), list(lengths[1])

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._round()
                restore()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._round()
        restore()
        return graph

    def start(self, last: int, h_11D: torch.Tensor, first_draft: int) -> None:
        self.last_1.fill_(last)
        self.first_1.fill_(first_draft)
        self.h_11D.copy_(h_11D)

    def _round(self) -> None:
        K, draft, draft_cache = self.K, self.draft, self.draft_cache
        drafts, h_11D, d_1 = [self.first_1], self.h_11D, self.first_1
        for _ in range(K - 1):
            h_11D, logits_11V = draft(h_11D, d_1.view(1, 1), draft_cache)
            d_1 = logits_11V[0, 0].float().argmax(-1, keepdim=True)
            drafts.append(d_1)
        drafts_K = torch.cat(drafts)
        out = self.target(torch.cat([self.last_1, drafts_K]).view(1, K + 1), cache=self.target_cache)
        t_K1 = out.logits_BTV[0].float().argmax(-1)
        a_1 = (drafts_K == t_K1[:K]).long().cumprod(0).sum().view(1)
        self.target_cache.keep(a_1 + 1, K + 1)
        # The draft forgets its chain (K − 1 one-token writes: a length is all an MLA cache needs)
        # and reads the target's features of the K + 1 fed positions, each with the token after it,
        # t_j; it keeps the first a + 1 of them (the next round overwrites the rest).
        draft_cache.lengths_B -= K - 1
        f_1TD = draft.fuse_features([self.seen["low"], self.seen["mid"], out.hidden_BTD])
        g_1TD, logits_1TV = draft(f_1TD, t_K1.view(1, K + 1), draft_cache)
        draft_cache.keep(a_1 + 1, K + 1)
        self.h_11D.copy_(g_1TD.index_select(1, a_1))
        self.first_1.copy_(logits_1TV[0].index_select(0, a_1).float().argmax(-1))
        self.last_1.copy_(t_K1.index_select(0, a_1))
        self.result_K2.copy_(torch.cat([t_K1, a_1]))

    @torch.no_grad()
    def __call__(self) -> tuple[list[int], int]:
        if self.graph is None:
            self._round()
        else:
            self.graph.replay()
        *t, a = self.result_K2.tolist()
        for cache in (self.target_cache, self.draft_cache):
            cache.lengths = [n + a + 1 for n in cache.lengths]
        return t, a


def _decode_static(target, draft, prompt, cfg, draft_len, budget, stats, capture: bool) -> list[int]:
    """Greedy speculative decoding through GreedyRound: the eager prefill of both models, then rounds.
    `capture` False runs each round eagerly over the same static caches (how the CPU tests check it)."""
    K, n = draft_len, len(prompt)
    device = next(target.parameters()).device
    # The last round may write K + 1 entries past the budget, and the draft's chain K − 1 more.
    capacity = capacity_bucket(n + budget + 2 * (K + 1))
    target_cache = ModelCache.empty(target, 1, capacity=capacity)
    draft_cache = ModelCache.empty(draft, 1, capacity=capacity)
    ids = lambda tokens: torch.tensor([tokens], device=device)  # noqa: E731
    with target_features(target, draft) as seen:
        out = target(ids(prompt), cache=target_cache, logits=False)
        stats.target_forwards += 1
        (first,), _ = _pick(last_logits(target, out.hidden_BTD), cfg, None)
        emitted = [first]
        if budget == 1 or first in cfg.stop_ids:
            return emitted
        f_1TD = draft.fuse_features([seen["low"], seen["mid"], out.hidden_BTD])
        g_1TD, draft_logits_1TV = draft(f_1TD, ids(prompt[1:] + emitted), draft_cache, last_only=True)
        def build() -> GreedyRound:
            return GreedyRound(target, draft, target_cache.to_static(capacity, K + 1),
                               draft_cache.to_static(capacity, K + 1), seen, K, capture)

        # A captured round is kept for later calls with this draft, draft length and capacity.
        rounds = reused(target, ("speculative", id(draft), K, capacity), build, target, draft) if capture else build()
        rounds.target_cache.load(target_cache)
        rounds.draft_cache.load(draft_cache)
        rounds.start(first, g_1TD[:, -1:], int(draft_logits_1TV[0, -1].float().argmax()))
        while True:
            t, a = rounds()
            stats.target_forwards += 1
            # As the eager loop counts it: the budget's last round drafts only what it can still emit.
            k = min(K, budget - len(emitted) - 1)
            if k:
                stats.rounds += 1
                stats.drafted += k
                stats.accepted += min(a, k)
                for j in range(min(a + 1, k)):
                    stats.reached_at_depth[j] += 1
                    stats.accepted_at_depth[j] += j < a
            new = t[: a + 1]
            emitted = emitted + new
            if len(emitted) >= budget or any(x in cfg.stop_ids for x in new):
                break
    for i, x in enumerate(emitted):
        if x in cfg.stop_ids:
            return emitted[: i + 1]
    return emitted[:budget]
