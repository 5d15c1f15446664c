"""The pure parts of the GRPO-family update used by the nine RL specialists (DESIGN.md §4, §5 claim 3).

Each prompt (an envs task at one effort) gets a group of G episodes from the current policy; an
episode's reward is its verifier's (1 success, 0 otherwise; a truncated episode scores 0) plus a
length term. The policy is then updated on every token it generated — across all turns of a
multi-turn episode, never on prompts or tool results — with one advantage per episode. Each choice
below, and why (research/recipe.md §5, research/posttrain-anchors.md §1, §6):

1. Group-relative advantages without std scaling (Dr. GRPO; nanochat's `r − mean`):
       A_i = r_i − mean_{j∈group} r_j
   Dividing by the group's std (GRPO's original) weights a group whose rewards barely differ
   (a prompt almost always solved or almost never) as much as a contested one, and divides by ~0 on
   the way; `scale="std"` restores it for comparison.
2. Groups whose episodes all succeeded or all failed are dropped and the batch refilled (DAPO
   dynamic sampling; SkyRL's `dynamic_sampling="filter"`). The test is on correctness, not on the
   shaped reward r below: the length term makes an all-fail group of unequal lengths "vary", and
   training on it would teach length, not the task (and dilute the token normalisation). So an
   all-correct group is dropped too, length differences and all: the length term acts inside groups
   whose correctness varies. `refill_groups` keeps drawing until the batch holds `n_groups`
   informative groups or `max_draw_factor · n_groups` groups were drawn (≥ 2, so refill is always
   on: a draw of only uninformative groups is drawn again rather than skipped), and reports the
   zero-variance fraction (logged per specialist).
3. Token-sum normalisation (DAPO; TRL's default `dapo` loss): the per-token losses of the whole
   batch are summed and divided by the batch's total number of policy tokens, not averaged per
   sequence first — a per-sequence mean gives each token of a short wrong answer more weight than
   a token of a long one (the length bias TRL's docs warn about). With micro-batches, pass the
   *global* token count as `denominator`, or the micro-batches' means no longer add up to the batch's.
4. Clip-higher PPO surrogate (DAPO: ε_low = 0.2, ε_high = 0.28), per token, with ρ = π_θ / π_old:
       L_t = −w_t · min(ρ_t A, clip(ρ_t, 1 − ε_low, 1 + ε_high) A)
   The wider upper bound lets low-probability tokens that earned a positive advantage grow faster,
   which counters entropy collapse on a small model. The clip only acts when π_θ ≠ π_old, so each
   rollout batch gets `updates_per_batch` ≥ 2 optimizer steps (PPO epochs; TRL's
   `num_iterations`): pass k runs the forward and backward over every micro-batch and steps once;
   π_old is the detached log-probability of pass 1 — the policy that sampled the batch, before any
   step — and stays fixed, so from pass 2 on ρ ≠ 1 and tokens that moved too far are clipped.
5. Truncated importance sampling on the rollout/training mismatch (Kimi Linear's RL recipe; verl,
   SkyRL "TIS"): episodes are sampled by the recurrent decode path (the engine), while π_old and π_θ
   come from the chunked training forward. Their per-token log-probabilities differ (kernel order,
   fake-quant vs real quantization), so each token is weighted by
       w_t = min(exp(log π_old(t) − log π_rollout(t)), C),   C = 2, detached;
   `logprob_mismatch` reports the difference's mean, max and the capped fraction for the log.
   The sampler's log-probabilities must be those of the *untruncated* distribution (no top-k/top-p
   renormalisation: TRL #6789) — the engine's `Completion.model_logprobs`.
6. No KL penalty by default (β = 0: DAPO, TRL's default): the verifier reward is exact, and a
   reference policy would double the forward cost. `kl_coef > 0` adds the k3 estimator
       KL_t ≈ exp(ref − θ) − (ref − θ) − 1   (DeepSeekMath).
7. Effort: each effort level has a hard budget of policy tokens per episode (the rollout's
   `max_new_tokens` summed over turns; an episode that hits it is truncated and scores 0) and a
   length term (Kimi k1.5's length reward, within the group):
       λ_i = 0.5 − (len_i − min_len) / (max_len − min_len)      (0 when all lengths are equal)
       r_i = correct_i + c_effort · (λ_i if correct_i else min(0, λ_i))
   c is largest at low, smaller at high and 0 at max, so low learns to answer briefly while max may
   use its budget; wrong answers are never rewarded for being short. The router bias is frozen
   during RL (DESIGN.md §4), which the rollout loop sets on the model.
8. `negative_scale` (default 1, plain GRPO) multiplies negative advantages: 0 reinforces only
   what beat its group's mean (filtered behaviour cloning, as in RAFT/ReST). Measured on tiny
   (docs/log/rl.md): it did not help there either, so the default stays 1.

9. Prompts: the RL prompts are drawn epoch by epoch — a fresh permutation of the pool per epoch,
   continued across steps and refills (`prompt_order`) — so every prompt is played once before any
   is played again, whatever P and the refills are.

Legend: P prompts (groups), G episodes per group, B = P·G sequences, T tokens.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import torch

from k3model.checkpoint import load_model
from k3model.engine import SamplingConfig
from k3model.train.common import (Loop, LoopConfig, autocast_for, build_optimizer, optimizer_step, restore_train_state,
                                  save_state, set_lr, tail_mean)
from k3model.train.effort import EFFORT_SPECS, EFFORTS, EffortSpec, training_harnesses
from k3model.train.evaluate import evaluate
from k3model.train.flops import FlopCounter, counting
from k3model.train.ladder import check_domain, default_rl_tasks
from k3model.train.rollout import play_tasks, sft_format
from k3model.train.sft import PAD_ID

ADVANTAGE_SCALES = ("none", "std")
T_ = TypeVar("T_")


@dataclass(frozen=True)
class GRPOConfig(LoopConfig):
    """LoopConfig with GRPO's defaults (6 steps at a constant 5e-4, no decay, every step logged)
    and the algorithm's fields (module docstring)."""
    steps: int = 6
    lr: float = 5e-4
    warmup_frac: float = 0.0  # one warmup step (the schedule's minimum), then constant:
    min_lr_ratio: float = 1.0  # RL steps are few and each is a fresh batch of the policy's own episodes
    weight_decay: float = 0.0
    log_every: int = 1
    group_size: int = 8  # G (TRL's default; research/posttrain-anchors.md §6)
    groups_per_step: int = 4  # P informative groups per update (tiny: ~15 s of CPU per step)
    max_draw_factor: int = 4  # refill stops after drawing this many times P groups (≥ 2: refill on)
    updates_per_batch: int = 2  # optimizer steps on each rollout batch (≥ 2: the clip acts from the second)
    advantage_scale: str = "none"
    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    negative_scale: float = 1.0  # A < 0 multiplied by this (1: GRPO; 0: reinforce successes only)
    efforts: dict[str, EffortSpec] = field(default_factory=lambda: dict(EFFORT_SPECS))
    # The loop (`train`): `updates_per_batch` policy updates per step on the kept groups (π_old =
    # the policy that sampled them, fixed; the ratio is 1 in the first pass only).
    temperature: float = 1.0  # sampling; no top-k/top-p, so the sampler's log-probs are unrenormalised
    micro_batch_tokens: int = 16384  # padded tokens per training forward (the loss uses the global count)
    max_episodes_per_batch: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("steps", "micro_batch_tokens", "max_episodes_per_batch")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (RL samples), got {self.temperature}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be ≥ 2 (advantages are relative to the group), "
                             f"got {self.group_size}")
        if self.groups_per_step < 1:
            raise ValueError(f"groups_per_step must be ≥ 1, got {self.groups_per_step}")
        if self.max_draw_factor < 2:
            raise ValueError(f"max_draw_factor must be ≥ 2 (refill on: a step whose first draw holds no group with "
                             f"both a success and a failure draws again), got {self.max_draw_factor}")
        if self.updates_per_batch < 2:
            raise ValueError(f"updates_per_batch must be ≥ 2 (with one update π_θ = π_old and the PPO clip never "
                             f"acts), got {self.updates_per_batch}")
        if self.advantage_scale not in ADVANTAGE_SCALES:
            raise ValueError(f"advantage_scale must be one of {ADVANTAGE_SCALES}, got {self.advantage_scale!r}")
        if not (0 < self.clip_low < 1 and self.clip_high > 0):
            raise ValueError(f"need 0 < clip_low < 1 and clip_high > 0, got {self.clip_low}, {self.clip_high}")
        if self.tis_cap < 1:
            raise ValueError(f"tis_cap must be ≥ 1 (1 would ignore the rollout mismatch), got {self.tis_cap}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be ≥ 0, got {self.kl_coef}")
        if not 0 <= self.negative_scale <= 1:
            raise ValueError(f"negative_scale must lie in [0, 1], got {self.negative_scale}")
        if set(self.efforts) != set(EFFORTS):
            raise ValueError(f"efforts must give a spec for each of {EFFORTS}, got {sorted(self.efforts)}")

    def effort(self, name: str) -> EffortSpec:
        if name not in self.efforts:
            raise ValueError(f"unknown effort {name!r}: choose from {EFFORTS}")
        return self.efforts[name]


# ----------------------------------------------------------------------------------------------
# Rewards and advantages

def length_term(correct_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
    """Kimi k1.5's group-relative length reward: λ for correct episodes, min(0, λ) for wrong ones."""
    lengths = lengths_PG.float()
    lo = lengths.min(-1, keepdim=True).values
    hi = lengths.max(-1, keepdim=True).values
    span = hi - lo
    lam_PG = torch.where(span > 0, 0.5 - (lengths - lo) / span.clamp(min=1e-9), torch.zeros_like(lengths))
    return torch.where(correct_PG.bool(), lam_PG, lam_PG.clamp(max=0.0))


def shaped_rewards(correct_PG: torch.Tensor, lengths_PG: torch.Tensor, length_coef: float) -> torch.Tensor:
    """r = correct + c · length_term: the reward the advantages are computed from."""
    return correct_PG.float() + length_coef * length_term(correct_PG, lengths_PG)


def group_advantages(rewards_PG: torch.Tensor, scale: str = "none", negative_scale: float = 1.0,
                     eps: float = 1e-6) -> torch.Tensor:
    """A = r − mean over the group (`scale="std"`: also divided by the group's std + eps); negative
    advantages multiplied by `negative_scale` (1: plain GRPO)."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    if rewards_PG.dim() != 2 or rewards_PG.shape[1] < 2:
        raise ValueError(f"rewards must be [prompts, group] with a group of ≥ 2, got {tuple(rewards_PG.shape)}")
    r = rewards_PG.float()
    adv = r - r.mean(-1, keepdim=True)
    if scale == "std":
        adv = adv / (r.std(-1, keepdim=True) + eps)
    return torch.where(adv < 0, adv * negative_scale, adv)


def has_variance(rewards: Sequence[float], tol: float = 0.0) -> bool:
    """True when the group's values are not all equal (within tol). `train` passes correctness
    (1 success, 0 not), never the shaped reward: item 2 of the module docstring."""
    return max(rewards) - min(rewards) > tol


def prompt_order(n_prompts: int, seed: int, start: int, count: int) -> list[int]:
    """Pool indices of the groups number start … start + count − 1 drawn in a run: epoch e = k // n
    plays a permutation of the pool seeded by (seed, e), so each epoch plays every prompt once."""
    if n_prompts < 1 or start < 0 or count < 0:
        raise ValueError(f"need n_prompts ≥ 1, start ≥ 0, count ≥ 0, got {n_prompts}, {start}, {count}")
    perms: dict[int, list[int]] = {}
    out = []
    for k in range(start, start + count):
        epoch = k // n_prompts
        if epoch not in perms:
            perms[epoch] = random.Random(f"{seed}/epoch{epoch}").sample(range(n_prompts), n_prompts)
        out.append(perms[epoch][k % n_prompts])
    return out


def refill_groups(draw: Callable[[int], list[T_]], rewards: Callable[[T_], Sequence[float]], n_groups: int,
                  max_draws: int) -> tuple[list[T_], dict[str, float]]:
    """Dynamic sampling: keep the groups whose rewards vary, drawing more until there are `n_groups`.

    `draw(k)` rolls out k new groups; `rewards(group)` gives a group's rewards. At most `max_draws`
    groups are drawn in all (the batch may come back short: the stats say so). Returns the kept
    groups (at most n_groups, in draw order) and `{"rl/groups_drawn", "rl/frac_zero_variance",
    "rl/groups_kept"}`.
    """
    if n_groups < 1 or max_draws < n_groups:
        raise ValueError(f"need 1 ≤ n_groups ≤ max_draws, got n_groups={n_groups}, max_draws={max_draws}")
    kept: list[T_] = []
    drawn = zero = 0
    while len(kept) < n_groups and drawn < max_draws:
        # Ask for what is missing; the next round asks again for whatever was dropped.
        new = draw(min(n_groups - len(kept), max_draws - drawn))
        if not new:
            raise ValueError("draw(k) returned no groups: the rollout source is exhausted")
        drawn += len(new)
        for group in new:
            if has_variance(rewards(group)):
                if len(kept) < n_groups:
                    kept.append(group)
            else:
                zero += 1
    return kept, {"rl/groups_drawn": float(drawn), "rl/frac_zero_variance": zero / drawn,
                  "rl/groups_kept": float(len(kept))}


# ----------------------------------------------------------------------------------------------
# Log-probabilities and the loss

def token_logprobs(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """log π(target_t | prefix) per position, in fp32 (targets outside the vocabulary are not allowed;
    mask them out after with the loss mask)."""
    logp_BTV = torch.log_softmax(logits_BTV.float(), dim=-1)
    return logp_BTV.gather(-1, targets_BT.clamp(min=0).unsqueeze(-1)).squeeze(-1)


def logprob_mismatch(logp_train_BT: torch.Tensor, logp_rollout_BT: torch.Tensor, mask_BT: torch.Tensor,
                     tis_cap: float = 2.0) -> dict[str, float]:
    """How far the training path's log-probabilities are from the rollout path's, on policy tokens."""
    m = mask_BT.bool()
    d = (logp_train_BT - logp_rollout_BT).detach()[m].float()
    if d.numel() == 0:
        raise ValueError("the mask selects no tokens")
    return {"rl/logp_diff_mean": float(d.mean()), "rl/logp_diff_abs_mean": float(d.abs().mean()),
            "rl/logp_diff_abs_max": float(d.abs().max()),
            "rl/tis_capped_frac": float((d.exp() > tis_cap).float().mean())}


def policy_loss(logp_BT: torch.Tensor, logp_old_BT: torch.Tensor, logp_rollout_BT: torch.Tensor,
                adv_B: torch.Tensor, mask_BT: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28,
                tis_cap: float = 2.0, kl_coef: float = 0.0, logp_ref_BT: torch.Tensor | None = None,
                denominator: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped, TIS-weighted, token-sum-normalised policy loss of the module docstring.

    logp_BT: log π_θ (with grad); logp_old_BT: log π_old from the training path before the update;
    logp_rollout_BT: the sampler's log-probabilities; adv_B: one advantage per sequence; mask_BT: 1 on
    policy tokens. `denominator` defaults to this batch's number of policy tokens. Returns the loss
    and detached statistics (tensors: read them when logging).
    """
    if kl_coef > 0 and logp_ref_BT is None:
        raise ValueError("kl_coef > 0 needs logp_ref_BT (the reference policy's log-probabilities)")
    m = mask_BT.float()
    n_tokens = m.sum()
    denom = n_tokens.clamp(min=1.0) if denominator is None else torch.as_tensor(float(denominator))
    adv_BT = adv_B.float().unsqueeze(-1).expand_as(m)
    ratio = torch.exp(logp_BT - logp_old_BT.detach())
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.minimum(ratio * adv_BT, clipped * adv_BT)
    w = torch.exp(logp_old_BT.detach() - logp_rollout_BT.detach()).clamp(max=tis_cap)
    per_token = -w * surrogate
    if kl_coef > 0:
        delta = logp_ref_BT.detach() - logp_BT
        per_token = per_token + kl_coef * (torch.exp(delta) - delta - 1.0)
    loss = (per_token * m).sum() / denom
    with torch.no_grad():
        safe = n_tokens.clamp(min=1.0)
        stats = {"rl/clip_low_frac": ((ratio < 1 - clip_low) & (adv_BT < 0)).float().mul(m).sum() / safe,
                 "rl/clip_high_frac": ((ratio > 1 + clip_high) & (adv_BT > 0)).float().mul(m).sum() / safe,
                 "rl/tis_weight_mean": (w * m).sum() / safe,
                 "rl/ratio_mean": (ratio * m).sum() / safe,
                 "rl/policy_tokens": n_tokens}
    return loss, stats


# ----------------------------------------------------------------------------------------------
# The loop: train(cfg, policy_checkpoint, tokenizer, out_dir, domain=, effort=) -> GRPOResult

@dataclass
class GRPOResult:
    checkpoint_dir: Path
    history: list[dict] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    resumed_from_step: int | None = None


def _sequence_logprobs(model, ids: list[list[int]], masks: list[list[bool]], device) -> torch.Tensor:
    """log π(token) through the training forward (chunked, no cache) at the masked positions of each
    sequence, concatenated in order [N]. Only those positions go through the output head."""
    T = max(len(x) for x in ids)
    ids_BT = torch.full((len(ids), T), PAD_ID, dtype=torch.long)
    mask_BT = torch.zeros((len(ids), T), dtype=torch.bool)
    for b, (x, m) in enumerate(zip(ids, masks)):
        ids_BT[b, : len(x)] = torch.tensor(x)
        mask_BT[b, : len(m)] = torch.tensor(m)
    ids_BT, mask_BT = ids_BT.to(device), mask_BT.to(device)
    hidden_BTD = model(ids_BT, logits=False).hidden_BTD
    # Token t is predicted at position t − 1; a generated token is never the first of a sequence.
    h_ND = hidden_BTD[:, :-1][mask_BT[:, 1:]]
    logits_NV = model.lm_head(model.final_norm(h_ND))
    return token_logprobs(logits_NV.unsqueeze(0), ids_BT[:, 1:][mask_BT[:, 1:]].unsqueeze(0))[0]


def _micro_batches(lengths: list[int], budget_tokens: int) -> list[list[int]]:
    """Sequence indices grouped (sorted by length) so each group's padded size stays within budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = [[]]
    for i in order:
        if out[-1] and (len(out[-1]) + 1) * lengths[i] > budget_tokens:
            out.append([])
        out[-1].append(i)
    return out


def train(cfg: GRPOConfig, policy_checkpoint, tokenizer, out_dir, *, domain: str, effort: str,
          harnesses: Sequence[str] | None = None, tasks: Sequence | None = None,
          log_fn: Callable[[int, dict], None] | None = None, eval_tasks: Sequence | None = None,
          stop_after: int | None = None) -> GRPOResult:
    """Train one specialist (domain × effort) from `policy_checkpoint` (sft_policy's), see the module
    docstring. `tasks`: the RL prompts (envs Tasks of `domain`; None: `ladder.default_rl_tasks`);
    `harnesses`: the styles sampled, round-robin over groups (None: every training harness);
    `eval_tasks`: held-out tasks scored after training (`eval/…` metrics, one sample each at the
    sampling temperature). Checkpoints: `out_dir/last` (resume point), `out_dir/final`."""
    # ---- setup
    spec = cfg.effort(effort)
    check_domain(domain)
    harness_names = training_harnesses(harnesses)
    pool = list(tasks) if tasks is not None else default_rl_tasks(domain)
    if not pool:
        raise ValueError("tasks is empty: give the RL prompts (k3model.train.ladder's rl_tasks) or None")
    for task in pool:
        if task.domain != domain:
            raise ValueError(f"task {task.id} is of domain {task.domain!r}, not {domain!r}: a specialist trains "
                             "on its own domain's tasks")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loop = Loop(cfg, out_dir, log_fn, stop_after=stop_after)

    # ---- model (QAT stays on when the policy was trained with it; the router bias is frozen)
    model, manifest = load_model(policy_checkpoint, frozen_router=True)
    qat = manifest.get("config", {}).get("qat")
    run = loop.resume(model)
    model.to(device)
    ref = copy.deepcopy(model).eval() if cfg.kl_coef > 0 else None
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    if run.state is not None:
        restore_train_state(run.state, optimizer)
    fmt = sft_format(tokenizer, effort)
    sampling = SamplingConfig(max_new_tokens=spec.turn_tokens, temperature=cfg.temperature)
    G, P = cfg.group_size, cfg.groups_per_step
    manifest_extra = {"config": {"grpo": asdict(cfg), "model": asdict(model.cfg), "qat": qat, "domain": domain,
                                 "effort": effort, "harnesses": list(harness_names),
                                 "tasks": [t.id for t in pool]},
                      "data_versions": {"policy_checkpoint": manifest.get("sha256", "")}}

    # Counted FLOPs of every step's rollouts and updates (mopd_student's equal-compute control), kept
    # in the resume point so a resumed run reports the whole run's, not only what it ran itself.
    flops = FlopCounter.for_model(model.cfg)
    if run.state is not None:
        flops.restore(run.state.extra.get("flops", {}))

    def save(step: int, path: Path, with_state: bool, metrics: dict | None = None) -> None:
        save_state(path, model, dict(manifest_extra, metrics=metrics or {}), optimizer if with_state else None,
                   step, {"history": run.history, "tokens_seen": run.tokens_seen, "flops": flops.as_dict()})

    # ---- loop
    # Groups drawn so far in the run (the position in the epoch-by-epoch prompt order): a resumed
    # run reads it from the last row its checkpoint kept (the resume point's step is always flushed).
    cursor = int(run.history[-1].get("rl/groups_drawn_total", 0)) if run.history else 0
    for step in loop.steps():
        set_lr(optimizer, cfg.lr_at(step))
        # Everything random in a step is a function of (seed, step) and the prompt cursor: a resumed
        # run draws the same.
        generator = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + step)
        drawn: list[list] = []
        t_roll = time.perf_counter()

        def draw(k: int) -> list[list]:
            at = cursor + len(drawn)
            picks = prompt_order(len(pool), cfg.seed, at, k)
            hs = [harness_names[(at + j) % len(harness_names)] for j in range(k)]
            played = play_tasks(model, fmt, [pool[i] for i in picks], hs, sampling, samples=G,
                                episode_budget=spec.budget_tokens, generator=generator,
                                max_episodes_per_batch=cfg.max_episodes_per_batch)
            groups = [[ep for _, _, ep in played[j * G:(j + 1) * G]] for j in range(k)]
            drawn.extend(groups)
            return groups

        def correct_of(group) -> list[float]:
            return [float(ep.reward >= 1.0) for ep in group]

        def rewards_of(group) -> list[float]:
            lengths = torch.tensor([[ep.n_generated for ep in group]])
            return shaped_rewards(torch.tensor([correct_of(group)]), lengths, spec.length_coef)[0].tolist()

        # Informative = both a success and a failure in the group (module docstring, item 2).
        with counting() as step_flops:
            kept, stats = refill_groups(draw, correct_of, n_groups=P, max_draws=P * cfg.max_draw_factor)
        cursor += len(drawn)
        t_roll = time.perf_counter() - t_roll
        episodes = [ep for g in drawn for ep in g]
        gen_tokens = sum(ep.n_generated for ep in episodes)
        metrics: dict = {"step": step + 1, **stats, "rl/groups_drawn_total": float(cursor),
                         "rl/prompt_epochs": cursor / len(pool),
                         "rl/success": sum(ep.reward >= 1.0 for ep in episodes) / len(episodes),
                         "rl/tokens_per_episode": gen_tokens / len(episodes),
                         "rl/frac_budget_stop": sum(ep.stop_reason == "budget" for ep in episodes) / len(episodes),
                         "perf/rollout_s": t_roll, "perf/rollout_tokens_per_s": gen_tokens / max(t_roll, 1e-9),
                         "train/lr": optimizer.param_groups[0]["lr"]}
        t_upd = time.perf_counter()
        if kept:
            with counting() as update_flops:
                metrics.update(_update(model, ref, optimizer, kept, rewards_of, cfg, device))
            for kind, value in update_flops.totals.items():
                step_flops.add(kind, value)
            t_upd = time.perf_counter() - t_upd
            metrics["perf/update_s"] = t_upd
            metrics["perf/update_tokens_per_s"] = metrics.pop("_padded_tokens") / max(t_upd, 1e-9)
        for kind, value in step_flops.totals.items():
            flops.add(kind, value)
        run.tokens_seen += gen_tokens
        loop.end_step(step, metrics, save)
    if loop.stopped:
        return GRPOResult(loop.last_dir, run.history, {}, run.from_step)

    # ---- final metrics and checkpoint
    hist = run.history
    metrics = {"rl/steps": float(cfg.steps), "rl/episodes_tokens": float(run.tokens_seen),
               **{f"flops/{k}": v for k, v in flops.as_dict().items()}}
    for key in ("rl/success", "rl/frac_zero_variance", "rl/tokens_per_episode", "perf/rollout_tokens_per_s",
                "perf/update_tokens_per_s", "rl/logp_diff_abs_mean"):
        values = [h[key] for h in hist if key in h]
        if values:
            metrics[f"{key}/mean"] = sum(values) / len(values)
    if hist:
        metrics["rl/success/first"] = hist[0]["rl/success"]
        metrics["rl/success/last"] = tail_mean(hist, "rl/success", frac=0.34)
    if eval_tasks is not None:
        report = evaluate(model, tokenizer, list(eval_tasks), effort, samples=1, temperature=cfg.temperature,
                          harness=harness_names, seed=cfg.seed)
        metrics.update({k: float(v) for k, v in report.as_metadata("eval/").items() if not isinstance(v, str)})
    loop.log(cfg.steps, metrics)
    save(cfg.steps, loop.final_dir, with_state=False, metrics=metrics)
    return GRPOResult(loop.final_dir, hist, metrics, run.from_step)


def _update(model, ref, optimizer, groups, rewards_of, cfg: GRPOConfig, device) -> dict:
    """`cfg.updates_per_batch` policy updates on the kept groups: advantages, then per pass the loss
    over micro-batches with the batch's global token count as denominator and one clipped optimizer
    step (`common.optimizer_step` backpropagates each micro-batch's loss as the generator yields it).
    π_old is pass 1's detached log-probabilities (the sampling policy), fixed for every pass.
    Returns pass 1's loss and rollout mismatch (on-policy figures) and the last pass's ratio and
    clip statistics (where the clip acts)."""
    adv_PG = group_advantages(torch.tensor([rewards_of(g) for g in groups]), cfg.advantage_scale, cfg.negative_scale)
    seqs = [ep for g in groups for ep in g]
    adv = adv_PG.reshape(-1).tolist()
    total = sum(ep.n_generated for ep in seqs)
    model.train()
    # Per micro-batch and per token: the sampler's log-prob (the behaviour policy), the untempered
    # one (for the mismatch), the episode's advantage and the reference policy's log-prob.
    fixed = []
    for mb in _micro_batches([len(ep.token_ids) for ep in seqs], cfg.micro_batch_tokens):
        ids = [seqs[i].token_ids for i in mb]
        masks = [seqs[i].generated for i in mb]
        rollout_N = torch.tensor([lp for i in mb for lp, g in zip(seqs[i].logprobs, seqs[i].generated) if g],
                                 device=device)
        untempered_N = torch.tensor([lp for i in mb for lp, g in zip(seqs[i].model_logprobs, seqs[i].generated)
                                     if g], device=device)
        adv_N = torch.tensor([adv[i] for i in mb for g in seqs[i].generated if g], device=device)
        ref_N = None
        if ref is not None:
            with torch.no_grad(), autocast_for(device):
                ref_N = _sequence_logprobs(ref, ids, masks, device)[:, None]
        fixed.append((ids, masks, rollout_N, untempered_N, adv_N, ref_N))
    old: list[torch.Tensor] = []
    diffs: list[torch.Tensor] = []
    padded = 0

    def micro_losses(k: int, acc: dict):
        """Pass k's micro-batch losses; their detached sum and token-weighted statistics go into acc."""
        nonlocal padded
        for j, (ids, masks, rollout_N, untempered_N, adv_N, ref_N) in enumerate(fixed):
            padded += len(ids) * max(len(x) for x in ids)
            with autocast_for(device):
                logp_N = _sequence_logprobs(model, ids, masks, device)
            if k == 0:
                old.append(logp_N.detach())
                diffs.append(logp_N.detach() - untempered_N)
            # Each token is its own row: [N, 1] tensors give the loss per-token advantages.
            loss, stats = policy_loss(logp_N[:, None], old[j][:, None], rollout_N[:, None], adv_N,
                                      torch.ones_like(adv_N)[:, None], cfg.clip_low, cfg.clip_high, cfg.tis_cap,
                                      cfg.kl_coef, ref_N, denominator=total)
            yield loss  # backpropagated by optimizer_step before the next micro-batch's forward
            acc["loss"] = acc.get("loss", 0.0) + loss.detach()
            for key, v in stats.items():
                acc[key] = acc.get(key, 0.0) + v * (len(adv_N) if key != "rl/policy_tokens" else 1)

    accs: list[dict] = []
    norms: list[torch.Tensor] = []
    for k in range(cfg.updates_per_batch):
        accs.append({})
        norms.append(optimizer_step(model, optimizer, micro_losses(k, accs[-1]), cfg.grad_clip))
    first, last = accs[0], accs[-1]
    d = torch.cat(diffs)
    out = {"train/loss": first["loss"], "train/grad_norm": norms[0], "train/loss_last_pass": last["loss"],
           "_padded_tokens": padded, "rl/adv_abs_mean": adv_PG.abs().mean(),
           "rl/updates_per_batch": float(cfg.updates_per_batch)}
    out.update({key: (v / total if key != "rl/policy_tokens" else v) for key, v in last.items() if key != "loss"})
    out.update(logprob_mismatch(d[:, None], torch.zeros_like(d)[:, None], torch.ones_like(d)[:, None], cfg.tis_cap))
    return out
