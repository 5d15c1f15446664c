"""Training the EAGLE-3-style draft (k3model/draft.py) on the target's own generations, with the
training-time test and soft targets (EAGLE-3, arXiv 2503.01840, `eagle/traineagle3/cnets.py`;
research/recipe.md §4(b, d), research/posttrain-anchors.md §5).

    setup → target and draft (draft_from_mtp) → optimizer → data → loop (eval/checkpoint, step, log)

- The target is the model as served: whatever forward `target` runs is the one the draft learns
  and is measured against. Deployment passes the packed MXFP4 export (k3model.quantize.load_quantized,
  what `k3 serve` loads), so the generations, the features and the soft targets below are the
  quantized forward's, not the float student's (its greedy tokens differ from the float model's
  where quantization flips an argmax; a draft fitted to the float model would propose those).

- Data: the target decodes the prompts with `k3model.engine.generate` (exact sampled ids, greedy by
  default: speculative decoding is measured greedy), and one no-grad forward of each prompt +
  completion keeps the target's low, middle and high features (k3model.draft.target_features) at
  every position. The target's distribution at a position is its head on the high features
  (p_i = softmax(LMHead(RMSNorm(h_high,i)))), computed per batch, so nothing of size V is stored;
  it runs in the target's own precision (autocast off), so p_i is the served forward's softmax.
- Prompts: `prompts_from_demonstrations` (every assistant turn of a datagen.sft table; `table_prompts`
  reads them from the table's file) to train on,
  `chat_prompts` (the first turn of held-out envs tasks exactly as an episode reads it: the env's
  observation in rollout.sft_format's conversation format) to evaluate and measure on.
- Loss, the training-time test over `ttt_steps` passes (DraftModel.unroll: pass s is the s-th
  chained draft, reading its own g of pass s−1, with the attention the inference cache gives it):

      L = Σ_s w^s · mean_{i valid} KL(p_{i+1} ‖ q^s_i)        w = step_weight (0.8 in EAGLE-3)

  valid: the predicted token x_{i+2} is in the completion (the draft serves decoding, not prompts)
  and pass s has a true prefix (i ≥ s). KL, not hard CE: the soft targets carry the target's
  whole distribution, which the exact sampling rule needs q to match.
- Simulated acceptance (NeMo Automodel's τ_sim; EAGLE #191, #195): a chain starting after true
  position m proposes argmax q^s_{m+s} for s = 0…K−1; draft s is accepted when it equals argmax
  p_{m+s+1}, the target's greedy token there. With acc_k = P(draft k accepted | drafts < k
  accepted) over all chain starts (the conditional n-α),

      τ_sim = 1 + Σ_k Π_{i≤k} acc_i = 1 + E[accepted drafts]          (the bonus or corrected token counted)

  at draft length K = ttt_steps, measured on held-out prompts' generations before the first step
  (the MTP module as a draft, untrained) and at every eval, and on each training batch.
- Measured decoding (`measure_speculative`): the trained draft in `k3model.speculative`'s greedy
  loop, τ = 1 + accepted / rounds, acceptance by depth, parity with plain greedy decoding and the
  speedup; the draft_model asset and benchmarks/decode/draft_target.py report it.
- The draft's embedding is the target's (frozen); fuse, merge, norms, the decoder block, the output
  mixer, final norm and head train (EAGLE-3 trains its own head). AdamW, warmup + cosine, clipping,
  resume: k3model.train.common's.

No Dagster, Ray or MLflow here: `log_fn(step, metrics)` sees progress.
Legend: B rows, T tokens (the batch's longest sequence), D width, V vocabulary, S passes.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from k3model.draft import DraftModel, draft_from_mtp, draft_manifest, target_features
from k3model.engine import SamplingConfig, generate
from k3model.speculative import speculative_generate
from k3model.train.common import (Loop, LoopConfig, autocast_for, build_optimizer, optimizer_step, restore_train_state,
                                  save_state, set_lr, tail_mean)

logger = logging.getLogger(__name__)

LogFn = Callable[[int, dict], None]


@dataclass(frozen=True)
class DraftTrainConfig(LoopConfig):
    """LoopConfig's schedule without weight decay, and the draft's own fields."""
    weight_decay: float = 0.0
    batch_size: int = 8
    ttt_steps: int = 6  # passes of the training-time test = the longest draft length it trains
    step_weight: float = 0.8  # pass s's loss weight is step_weight**s
    gen_tokens: int = 64  # new tokens the target decodes per prompt
    gen_temperature: float = 0.0  # 0: the target's greedy output, the case speculative decoding is measured in
    feature_batch: int = 16  # sequences per no-grad target forward when extracting features
    eval_every: int = 0  # 0: four evals per run (plus one before the first step)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("steps", "batch_size", "ttt_steps", "gen_tokens", "feature_batch")
        if not 0 < self.step_weight <= 1:
            raise ValueError(f"step_weight must lie in (0, 1], got {self.step_weight}")
        if self.gen_temperature < 0:
            raise ValueError(f"gen_temperature must be ≥ 0 (0 is greedy), got {self.gen_temperature}")


@dataclass
class DraftTrainResult:
    checkpoint_dir: Path
    history: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)  # {"step", "eval/tau_sim", "eval/acc_<k>", "eval/kl_<k>"}
    metrics: dict[str, float] = field(default_factory=dict)
    resumed_from_step: int | None = None


# ----------------------------------------------------------------------------------------------
# Data: the target's own generations and its features

@dataclass
class OwnGenerations:
    """Prompt + the target's completion per row, with the target's features at every position."""
    ids: list[torch.Tensor]  # [T_r] long
    prompt_lens: list[int]
    features: list[torch.Tensor]  # [T_r, 3, D] (low, mid, high), fp32

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def completion_tokens(self) -> int:
        return sum(len(x) - n for x, n in zip(self.ids, self.prompt_lens))

    def batch(self, rows: Sequence[int], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids_BT, features_BT3D, completion-start per row [B]), right-padded with id 0 and zeros."""
        T = max(len(self.ids[r]) for r in rows)
        D = self.features[rows[0]].shape[-1]
        ids_BT = torch.zeros(len(rows), T, dtype=torch.long)
        feats_BT3D = torch.zeros(len(rows), T, 3, D)
        lens = torch.zeros(len(rows), 2, dtype=torch.long)
        for b, r in enumerate(rows):
            n = len(self.ids[r])
            ids_BT[b, :n], feats_BT3D[b, :n] = self.ids[r], self.features[r]
            lens[b, 0], lens[b, 1] = self.prompt_lens[r], n
        return ids_BT.to(device), feats_BT3D.to(device), lens.to(device)


@torch.no_grad()
def own_generations(target, draft: DraftModel, prompts: Sequence[Sequence[int]], cfg: DraftTrainConfig,
                    stop_ids: Sequence[int] = (), generator: torch.Generator | None = None) -> OwnGenerations:
    """The target decodes every prompt (engine.generate, one batch), then its features are read
    over prompt + completion. Rows whose completion is empty are dropped."""
    if not prompts:
        raise ValueError("no prompts: the draft trains on the target's generations from prompts")
    sampling = SamplingConfig(max_new_tokens=cfg.gen_tokens, temperature=cfg.gen_temperature, stop_ids=tuple(stop_ids))
    completions = generate(target, [list(p) for p in prompts], sampling, generator=generator)
    rows = [(list(p), c.token_ids) for p, c in zip(prompts, completions) if c.token_ids]
    device = next(target.parameters()).device
    was_training = target.training
    target.eval()
    ids, lens, features = [], [], []
    try:
        # Equal-length sequences share a forward (no padding passes through KDA's recurrence).
        by_len: dict[int, list[list[int]]] = {}
        for p, c in rows:
            by_len.setdefault(len(p) + len(c), []).append(p + c)
        prompt_len = {tuple(p + c): len(p) for p, c in rows}
        with target_features(target, draft) as seen:
            for T, seqs in sorted(by_len.items()):
                for at in range(0, len(seqs), cfg.feature_batch):
                    part = seqs[at: at + cfg.feature_batch]
                    ids_BT = torch.tensor(part, device=device)
                    out = target(ids_BT, logits=False)
                    f_BT3D = torch.stack([seen["low"], seen["mid"], out.hidden_BTD], dim=2).float().cpu()
                    for b, seq in enumerate(part):
                        ids.append(torch.tensor(seq))
                        lens.append(prompt_len[tuple(seq)])
                        features.append(f_BT3D[b])
    finally:
        target.train(was_training)
    if not ids:
        raise ValueError("the target stopped at once on every prompt (empty completions): nothing to train "
                         "on; give other prompts or fewer stop ids")
    return OwnGenerations(ids, lens, features)


def prompts_from_demonstrations(input_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]],
                                 max_prompt_tokens: int | None = None) -> list[list[int]]:
    """The prompts a policy is decoded from in these rows (a `datagen.sft` table's `input_ids` and
    `loss_mask` columns): every prefix that ends where the model's own tokens start (each assistant
    turn), the first `max_prompt_tokens` or fewer tokens long, duplicates dropped, in order."""
    seen, out = set(), []
    for ids, mask in zip(input_ids, loss_masks):
        for t in range(1, len(ids)):
            if mask[t] and not mask[t - 1] and (max_prompt_tokens is None or t <= max_prompt_tokens):
                prompt = tuple(ids[:t])
                if prompt not in seen:
                    seen.add(prompt)
                    out.append(list(prompt))
    return out


def table_prompts(path: str, max_prompt_tokens: int, limit: int) -> list[list[int]]:
    """The first `limit` prompts of `prompts_from_demonstrations` of the datagen.sft table at `path`."""
    # Parquet (pyarrow) only here: the rest of the module runs with torch alone.
    from datagen.io import read_parquet
    table = read_parquet(path)
    prompts = prompts_from_demonstrations(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(),
                                          max_prompt_tokens)
    return prompts[:limit]


@dataclass(frozen=True)
class ChatPrompt:
    """An envs task's first turn as the policy reads it: `ids` end where the model's turn starts."""
    ids: list[int]
    family: str
    seed: int
    effort: str
    harness: str


def chat_prompts(tokenizer, families: Sequence[str], efforts: Sequence[str], harnesses: Sequence[str], n: int,
                 seed_base: int, max_tokens: int) -> list[ChatPrompt]:
    """`n` chat-formatted prompts of held-out tasks, each what an episode's first turn reads:
    `env.reset(task)`'s observation (the harness's system prompt and the task) wrapped by
    `rollout.sft_format(tokenizer, effort).first_observation` (<|bos|><|system|><|effort_E|> … the
    turn tokens that hand over to the assistant). Candidate j is task `seed_base + j // F` of
    family j mod F (F families; the tasks `recipes.eval_plan` scores policies on, seeds from
    EVAL_SEED_BASE), at effort (j // F) mod E and harness (j // F + j mod F) mod H, so the first F·E·H
    cover every family at every effort and harness. Candidates longer than `max_tokens` are
    skipped (a profile's context can be shorter than some harnesses' system prompts); ValueError
    when fewer than `n` fit among the first 50·n + F·E·H."""
    import envs
    from k3model.train.rollout import sft_format

    if n < 1 or max_tokens < 1:
        raise ValueError(f"n and max_tokens must be ≥ 1, got {n}, {max_tokens}")
    if not (families and efforts and harnesses):
        raise ValueError(f"give at least one family, effort and harness, got {families}, {efforts}, {harnesses}")
    F, E, H = len(families), len(efforts), len(harnesses)
    formats = {e: sft_format(tokenizer, e) for e in efforts}
    out: list[ChatPrompt] = []
    tries = 50 * n + F * E * H
    for j in range(tries):
        family, seed = families[j % F], seed_base + j // F
        effort, harness = efforts[(j // F) % E], harnesses[(j // F + j % F) % H]
        with envs.make_env(family, harness=harness) as env:
            ids = formats[effort].first_observation(env.reset(task=envs.generate(family, seed)))
        if len(ids) <= max_tokens:
            out.append(ChatPrompt(ids, family, seed, effort, harness))
            if len(out) == n:
                return out
    raise ValueError(f"only {len(out)} of the first {tries} held-out task prompts fit in {max_tokens} tokens, "
                     f"{n} wanted: raise the limit (the profile's context) or ask for fewer prompts")


# ----------------------------------------------------------------------------------------------
# The loss and the simulated acceptance (pure given the tensors)

def valid_positions(lens_B2: torch.Tensor, T: int, s: int) -> torch.Tensor:
    """[B, T] bool: pass s at position i predicts x_{i+2}, which lies in the completion
    (i + 2 ≥ prompt length, i + 2 < length), with a true prefix (i ≥ s)."""
    i_1T = torch.arange(T, device=lens_B2.device).unsqueeze(0)
    return (i_1T + 2 >= lens_B2[:, :1]) & (i_1T + 2 < lens_B2[:, 1:]) & (i_1T >= s)


def target_next(target, features_BT3D: torch.Tensor) -> torch.Tensor:
    """The target's log-distribution of the token after each position, from its high features:
    log softmax(LMHead(RMSNorm(h_high))) [B, T, V] (fp32), the served forward's own logits."""
    # The training step's bf16 autocast (CUDA) would round the head's inputs and weights: the
    # teacher is the head as the target runs it when serving, not a bf16 copy of it.
    with torch.autocast(features_BT3D.device.type, enabled=False):
        return target.lm_head(target.final_norm(features_BT3D[:, :, 2])).float().log_softmax(-1)


def ttt_losses(draft: DraftModel, target, ids_BT: torch.Tensor, features_BT3D: torch.Tensor,
               lens_B2: torch.Tensor, steps: int, step_weight: float) -> dict[str, torch.Tensor]:
    """The weighted KL of every pass and the greedy matches; keys `loss`, `kl_<s>`, and `match_<s>`
    ([B, T] bool, argmax q^s_i = argmax p_{i+1}), `valid_<s>` ([B, T] bool) for `simulated_acceptance`.
    Heads and softmaxes run on the valid positions only (the completion: a small part of each
    row, and the V-wide work is most of the step)."""
    B, T = ids_BT.shape
    valid0_BT = valid_positions(lens_B2, T, 0)
    with torch.no_grad():
        # p_{i+1}, the target at the next position, for every valid i (i + 1 < length by validity).
        b_N, i_N = valid0_BT.nonzero(as_tuple=True)
        logp_NV = target_next(target, features_BT3D[b_N, i_N + 1].unsqueeze(1)).squeeze(1)
        p_NV = logp_NV.exp()
        greedy_N = logp_NV.argmax(-1)
    next_ids_BT = torch.cat([ids_BT[:, 1:], ids_BT[:, -1:]], dim=1)
    f_BTD = draft.fuse_features(list(features_BT3D.unbind(2)))
    out: dict[str, torch.Tensor] = {}
    total = features_BT3D.new_zeros(())
    # Valid positions start at i = P − 2 (P the shortest prompt): pass s there needs passes ≥ 1 from
    # P − 2 − s + 1 on, so the long prompt runs through pass 0 only.
    start = max(0, int(lens_B2[:, 0].min()) - steps - 1)
    for s, g_BTD in enumerate(draft.unroll(f_BTD, next_ids_BT, steps, start=start)):
        valid_BT = valid_positions(lens_B2, T, s)
        keep_N = valid_BT[b_N, i_N]  # pass s's valid positions among pass 0's (a subset: i ≥ s)
        logq_MV = draft.head(g_BTD[b_N[keep_N], i_N[keep_N]]).float().log_softmax(-1)
        kl_M = (p_NV[keep_N] * (logp_NV[keep_N] - logq_MV)).sum(-1)
        kl = kl_M.mean() if kl_M.numel() else kl_M.sum()
        total = total + step_weight ** s * kl
        out[f"kl_{s}"] = kl.detach()
        match_BT = torch.zeros(B, T, dtype=torch.bool, device=ids_BT.device)
        match_BT[b_N[keep_N], i_N[keep_N]] = logq_MV.detach().argmax(-1) == greedy_N[keep_N]
        out[f"match_{s}"] = match_BT
        out[f"valid_{s}"] = valid_BT
    out["loss"] = total
    return out


def simulated_acceptance(parts: dict[str, torch.Tensor], steps: int) -> dict[str, torch.Tensor]:
    """acc_k (conditional on drafts < k accepted) and τ_sim = 1 + Σ_k Π_{i≤k} acc_i over chains
    starting after each true position m whose K = `steps` drafts all predict completion tokens:
    draft k of chain m is pass k at position m + k. Also `acc_uncond_<k>`: per-pass accuracy over its
    valid positions (the unconditional figure EAGLE's logs show, #191)."""
    match = [parts[f"match_{s}"] for s in range(steps)]
    valid = [parts[f"valid_{s}"] for s in range(steps)]
    B, T = match[0].shape
    M = T - steps + 1
    out: dict[str, torch.Tensor] = {}
    if M <= 0:
        return out
    # Chain m's draft s sits at position m + s: shift pass s left by s.
    chain_ok_BM = torch.ones(B, M, dtype=torch.bool, device=match[0].device)
    for s in range(steps):
        chain_ok_BM &= valid[s][:, s: s + M]
    n_chains = chain_ok_BM.sum()
    alive_BM = chain_ok_BM.clone()
    tau = torch.ones((), device=match[0].device, dtype=torch.float64)
    for s in range(steps):
        reached = alive_BM.sum()
        alive_BM = alive_BM & match[s][:, s: s + M]
        out[f"acc_{s + 1}"] = alive_BM.sum().double() / reached.clamp(min=1)
        tau = tau + alive_BM.sum().double() / n_chains.clamp(min=1)
        out[f"acc_uncond_{s + 1}"] = (match[s] & valid[s]).sum().double() / valid[s].sum().clamp(min=1)
    out["tau_sim"] = tau
    out["chains"] = n_chains
    return out


@torch.no_grad()
def evaluate_draft(draft: DraftModel, target, data: OwnGenerations, steps: int, step_weight: float,
                   batch_size: int = 8) -> dict[str, float]:
    """τ_sim, conditional acceptance per depth and KL per pass over all of `data` (held-out
    generations), counts pooled over batches (not a mean of batch ratios)."""
    device = next(draft.parameters()).device
    was_training = draft.training
    draft.eval()
    reached, accepted, kl_sum, kl_n = [0] * steps, [0] * steps, [0.0] * steps, [0] * steps
    chains = 0
    try:
        for at in range(0, len(data), batch_size):
            ids_BT, feats, lens = data.batch(range(at, min(at + batch_size, len(data))), device)
            parts = ttt_losses(draft, target, ids_BT, feats, lens, steps, step_weight)
            B, T = ids_BT.shape
            M = T - steps + 1
            if M <= 0:
                continue
            alive = torch.ones(B, M, dtype=torch.bool, device=device)
            for s in range(steps):
                alive &= parts[f"valid_{s}"][:, s: s + M]
            chains += int(alive.sum())
            for s in range(steps):
                reached[s] += int(alive.sum())
                alive &= parts[f"match_{s}"][:, s: s + M]
                accepted[s] += int(alive.sum())
                n = int(parts[f"valid_{s}"].sum())
                kl_sum[s] += float(parts[f"kl_{s}"]) * n
                kl_n[s] += n
    finally:
        draft.train(was_training)
    acc = [a / r if r else 0.0 for a, r in zip(accepted, reached)]
    out = {"eval/tau_sim": 1.0 + sum(math.prod(acc[: k + 1]) for k in range(steps)), "eval/chains": float(chains)}
    for s in range(steps):
        out[f"eval/acc_{s + 1}"] = acc[s]
        out[f"eval/kl_{s}"] = kl_sum[s] / kl_n[s] if kl_n[s] else float("nan")
    return out


def tau_by_draft_len(evaluation: dict[str, float], steps: int) -> dict[int, float]:
    """τ_sim at each draft length K ≤ steps from one evaluation's conditional acceptances."""
    acc = [evaluation[f"eval/acc_{s + 1}"] for s in range(steps)]
    return {K: 1.0 + sum(math.prod(acc[: k + 1]) for k in range(K)) for K in range(1, steps + 1)}


# ----------------------------------------------------------------------------------------------
# Speculative decoding with a trained draft, measured

def measure_speculative(target, drafts: dict, prompts: list[list[int]], new_tokens: int,
                        draft_lens: tuple[int, ...]) -> dict:
    """Greedy speculative decoding of every prompt at every draft length, per draft: τ = 1 + accepted
    / rounds (pooled over every prompt's drafting rounds), conditional acceptance by depth, parity with
    the target's own plain greedy output (lossless), tokens/s against plain decoding. Every path runs
    once untimed first (first calls allocate and load kernels), then each prompt is timed plain and
    right after at every (draft, length), so load that comes and goes on a shared machine falls on
    both sides alike. `drafts`: {name: DraftModel}; returns {name: {draft_len: figures}}."""
    cfg = SamplingConfig(max_new_tokens=new_tokens)
    warm = SamplingConfig(max_new_tokens=min(new_tokens, max(draft_lens) + 2))
    generate(target, [prompts[0]], warm)
    for draft in drafts.values():
        for k in draft_lens:
            speculative_generate(target, draft, prompts[0], warm, k)
    plain_s, plain_tokens = 0.0, 0
    rows = {name: {k: {"seconds": 0.0, "tokens": 0, "rounds": 0, "accepted": 0, "parity": 0,
                       "reached": [0] * k, "acc": [0] * k} for k in draft_lens} for name in drafts}
    for p in prompts:
        t = time.perf_counter()
        expected = generate(target, [p], cfg)[0].token_ids
        plain_s += time.perf_counter() - t
        plain_tokens += len(expected)
        for name, draft in drafts.items():
            for k in draft_lens:
                row = rows[name][k]
                t = time.perf_counter()
                ids, stats = speculative_generate(target, draft, p, cfg, k)
                row["seconds"] += time.perf_counter() - t
                row["tokens"] += len(ids)
                row["rounds"] += stats.rounds
                row["accepted"] += stats.accepted
                row["parity"] += ids == expected
                row["reached"] = [a + b for a, b in zip(row["reached"], stats.reached_at_depth)]
                row["acc"] = [a + b for a, b in zip(row["acc"], stats.accepted_at_depth)]
    out = {}
    for name, by_k in rows.items():
        out[name] = {}
        for k, row in by_k.items():
            seconds, rounds = row["seconds"], row["rounds"]
            out[name][k] = {
                "acceptance_length": 1.0 + row["accepted"] / rounds if rounds else 0.0,
                "rounds": rounds, "accepted": row["accepted"],
                "acceptance_by_depth": [a / r if r else None for a, r in zip(row["acc"], row["reached"])],
                "greedy_parity": row["parity"] / len(prompts),
                "speedup": (row["tokens"] / seconds) / (plain_tokens / plain_s) if seconds and plain_s else None}
    return out


# ----------------------------------------------------------------------------------------------
# The loop

def _rows(n: int, seed: int, step: int, batch_size: int) -> list[int]:
    """Batch `step`'s rows: positions step·B … of per-epoch permutations seeded by (seed, epoch)."""
    out, perms = [], {}
    for p in range(step * batch_size, (step + 1) * batch_size):
        epoch = p // n
        if epoch not in perms:
            perms[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
        out.append(perms[epoch][p % n])
    return out


def train(cfg: DraftTrainConfig, target, prompts: Sequence[Sequence[int]], out_dir: str | Path, *,
          eval_prompts: Sequence[Sequence[int]], stop_ids: Sequence[int] = (), target_manifest: dict | None = None,
          log_fn: LogFn | None = None, stop_after: int | None = None) -> DraftTrainResult:
    """Train a draft for `target` (a K3Model with an MTP module, as it is served: the packed MXFP4
    export for a quantized deployment; frozen here) on its own generations from `prompts`,
    evaluating τ_sim on `eval_prompts`' generations (held out). Writes
    the draft to `out_dir/final` (k3model.draft.load_draft reads it back) and resume points to
    `out_dir/last`. `target_manifest` (the target checkpoint's) is recorded as the draft's lineage."""
    # ---- setup
    device = next(target.parameters()).device
    loop = Loop(cfg, out_dir, log_fn, stop_after=stop_after)
    eval_every = cfg.eval_every or max(cfg.steps // 4, 1)

    # ---- target (frozen) and draft
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    draft = draft_from_mtp(target)
    draft.embed.weight.requires_grad_(False)
    run = loop.resume(draft)
    draft.to(device)

    # ---- optimizer
    optimizer = build_optimizer(draft, cfg.lr, cfg.weight_decay)
    if run.state is not None:
        restore_train_state(run.state, optimizer)

    # ---- data: the target's own generations (train and held out), deterministic for a seed
    gen = torch.Generator().manual_seed(cfg.seed)
    data = own_generations(target, draft, prompts, cfg, stop_ids, gen)
    held_out = own_generations(target, draft, eval_prompts, cfg, stop_ids, gen)
    quantization = (target_manifest or {}).get("quantization")
    quant_format = quantization.get("format") if isinstance(quantization, dict) else None
    manifest_extra = {"config": {"draft_train": asdict(cfg), "draft": asdict(draft.cfg)},
                      **draft_manifest(draft, target_manifest),
                      "target": {"sha256": (target_manifest or {}).get("sha256"),
                                 "quantization": quant_format},
                      "data": {"prompts": len(prompts), "rows": len(data), "completion_tokens": data.completion_tokens,
                               "eval_prompts": len(eval_prompts), "eval_completion_tokens": held_out.completion_tokens}}
    evals: list[dict] = list(run.state.extra.get("evals", [])) if run.state is not None else []

    def evaluate(step: int) -> None:
        row = {"step": step, **evaluate_draft(draft, target, held_out, cfg.ttt_steps, cfg.step_weight, cfg.batch_size)}
        evals.append(row)
        loop.log(step, row)

    def save(step: int, path: Path, with_state: bool, metrics: dict | None = None) -> None:
        save_state(path, draft, dict(manifest_extra, metrics=metrics or {}), optimizer if with_state else None, step,
                   {"history": run.history, "tokens_seen": run.tokens_seen, "evals": evals})

    if run.state is None:
        evaluate(0)  # the MTP module as a draft, untrained

    # ---- loop
    for step in loop.steps():
        lr = cfg.lr_at(step)
        set_lr(optimizer, lr)
        ids_BT, feats, lens = data.batch(_rows(len(data), cfg.seed, step, cfg.batch_size), device)
        draft.train()
        with autocast_for(device):
            parts = ttt_losses(draft, target, ids_BT, feats, lens, cfg.ttt_steps, cfg.step_weight)
        grad_norm = optimizer_step(draft, optimizer, parts["loss"], cfg.grad_clip)
        n_tokens = int(parts["valid_0"].sum())
        run.tokens_seen += n_tokens
        metrics = {"train/loss": parts["loss"].detach(), "train/grad_norm": grad_norm, "train/lr": lr, "step": step + 1}
        metrics.update({f"train/kl_{s}": parts[f"kl_{s}"] for s in range(cfg.ttt_steps)})
        metrics.update({f"train/{k}": v for k, v in simulated_acceptance(parts, cfg.ttt_steps).items() if k != "chains"})
        done = step + 1
        if done % eval_every == 0 or done == cfg.steps:
            evaluate(done)  # untimed: the step's throughput window restarts after it
            loop.buffer.restart_clock()
        loop.end_step(step, metrics, save, tokens=n_tokens)
    if loop.stopped:
        return DraftTrainResult(loop.last_dir, run.history, evals, {}, run.from_step)

    # ---- final metrics and checkpoint
    first, final = evals[0], evals[-1]
    metrics = {"draft/tau_sim_untrained": first["eval/tau_sim"], "draft/tau_sim": final["eval/tau_sim"],
               **{f"draft/tau_sim_k{K}": v for K, v in tau_by_draft_len(final, cfg.ttt_steps).items()},
               **{f"draft/tau_sim_untrained_k{K}": v for K, v in tau_by_draft_len(first, cfg.ttt_steps).items()},
               **{f"draft/acc_{s + 1}": final[f"eval/acc_{s + 1}"] for s in range(cfg.ttt_steps)},
               "train/tokens_seen": float(run.tokens_seen),
               "perf/tokens_per_s": loop.buffer.tokens / max(loop.buffer.seconds, 1e-9)}
    if run.history:
        metrics["train/first_loss"] = run.history[0]["train/loss"]
        metrics["train/final_loss"] = tail_mean(run.history, "train/loss")
    loop.log(cfg.steps, metrics)
    save(cfg.steps, loop.final_dir, with_state=False, metrics=metrics)
    return DraftTrainResult(loop.final_dir, run.history, evals, metrics, run.from_step)
