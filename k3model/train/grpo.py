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
2. Groups with zero reward variance are dropped and the batch refilled (DAPO dynamic sampling;
   SkyRL's `dynamic_sampling="filter"`): with A ≡ 0 they carry no gradient but still dilute the
   token normalisation. `refill_groups` keeps drawing until the batch holds `n_groups` informative
   groups or a draw limit is reached, and reports the zero-variance fraction (logged per specialist).
3. Token-sum normalisation (DAPO; TRL's default `dapo` loss): the per-token losses of the whole
   batch are summed and divided by the batch's total number of policy tokens, not averaged per
   sequence first — a per-sequence mean gives each token of a short wrong answer more weight than
   a token of a long one (the length bias TRL's docs warn about). With micro-batches, pass the
   *global* token count as `denominator`, or the micro-batches' means no longer add up to the batch's.
4. Clip-higher PPO surrogate (DAPO: ε_low = 0.2, ε_high = 0.28), per token, with ρ = π_θ / π_old:
       L_t = −w_t · min(ρ_t A, clip(ρ_t, 1 − ε_low, 1 + ε_high) A)
   The wider upper bound lets low-probability tokens that earned a positive advantage grow faster,
   which counters entropy collapse on a small model.
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

Legend: P prompts (groups), G episodes per group, B = P·G sequences, T tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

EFFORTS = ("low", "high", "max")
ADVANTAGE_SCALES = ("none", "std")
T_ = TypeVar("T_")


@dataclass(frozen=True)
class EffortSpec:
    """Per-effort rollout budget (policy tokens per episode, all turns), the cap of one turn, and
    the length-term weight."""
    budget_tokens: int
    length_coef: float
    turn_tokens: int = 256


# Budgets sized from the tiny-profile SFT data (docs/log/posttrain.md): the median demonstration
# spends at most ~610 policy tokens per episode at low and ~1020 at max (canvas_submit_drafts);
# each budget leaves room above that, and doubles from one effort to the next. A turn's cap leaves
# room above the longest demonstrated turn at that effort (a write_function call is ~200 tokens;
# max's scratchpad adds up to ~150 on one turn).
EFFORT_SPECS: dict[str, EffortSpec] = {
    "low": EffortSpec(budget_tokens=1024, length_coef=0.2, turn_tokens=256),
    "high": EffortSpec(budget_tokens=2048, length_coef=0.1, turn_tokens=384),
    "max": EffortSpec(budget_tokens=4096, length_coef=0.0, turn_tokens=512),
}


@dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8  # G (TRL's default; research/posttrain-anchors.md §6)
    groups_per_step: int = 8  # P informative groups per update
    max_draw_factor: int = 4  # refill stops after drawing this many times P groups
    advantage_scale: str = "none"
    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    efforts: dict[str, EffortSpec] = field(default_factory=lambda: dict(EFFORT_SPECS))

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be ≥ 2 (advantages are relative to the group), "
                             f"got {self.group_size}")
        if self.groups_per_step < 1 or self.max_draw_factor < 1:
            raise ValueError("groups_per_step and max_draw_factor must be ≥ 1")
        if self.advantage_scale not in ADVANTAGE_SCALES:
            raise ValueError(f"advantage_scale must be one of {ADVANTAGE_SCALES}, got {self.advantage_scale!r}")
        if not (0 < self.clip_low < 1 and self.clip_high > 0):
            raise ValueError(f"need 0 < clip_low < 1 and clip_high > 0, got {self.clip_low}, {self.clip_high}")
        if self.tis_cap < 1:
            raise ValueError(f"tis_cap must be ≥ 1 (1 would ignore the rollout mismatch), got {self.tis_cap}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be ≥ 0, got {self.kl_coef}")
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


def group_advantages(rewards_PG: torch.Tensor, scale: str = "none", eps: float = 1e-6) -> torch.Tensor:
    """A = r − mean over the group (`scale="std"`: also divided by the group's std + eps)."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    if rewards_PG.dim() != 2 or rewards_PG.shape[1] < 2:
        raise ValueError(f"rewards must be [prompts, group] with a group of ≥ 2, got {tuple(rewards_PG.shape)}")
    r = rewards_PG.float()
    adv = r - r.mean(-1, keepdim=True)
    if scale == "std":
        adv = adv / (r.std(-1, keepdim=True) + eps)
    return adv


def has_variance(rewards: Sequence[float], tol: float = 0.0) -> bool:
    """True when the group's rewards are not all equal (within tol): it carries a learning signal."""
    return max(rewards) - min(rewards) > tol


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
