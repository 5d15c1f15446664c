"""The post-training vocabulary: domains, efforts, their budgets, harness sets and routes.

Every trainer and evaluator of post-training (SFT, GRPO, MOPD, the ladder, the evaluator) and the
assets above them name a cell of the 3 × 3 grid the same way (DESIGN.md §4, §5 claims 3–4):

- a *domain* (`DOMAINS`, the envs task domains, re-exported) and an *effort* (`EFFORTS`, the
  effort tags the SFT data puts before every assistant turn, re-exported from `datagen.sft`);
- a *route* `(domain, effort)`: one RL specialist, one MOPD teacher; its Dagster partition key is
  `"domain|effort"` (`partition_key`);
- an effort's *spec*: the episode budget in policy tokens (an episode that reaches it is truncated
  and scores 0), the cap of one turn, and the GRPO length-term weight c (research/recipe.md §5):
      r_i = correct_i + c_effort · (λ_i if correct_i else min(0, λ_i))
  c is largest at low and 0 at max;
- the *training harnesses*: every envs harness but `HELD_OUT_HARNESS`, which no main-lineage
  training sees (kept for the cross-harness evaluation, claim 7).

Layers: `envs` and `datagen` stand below `k3model`, so the names they need themselves (`DOMAINS`,
`EFFORTS`, `HELD_OUT_HARNESS`) are defined there and only re-exported here. It builds no model:
the recipes (`k3model.train.recipes`) and the Dagster assets read it as plain data.
`freeze_router_bias` (the RL rule on the router, DESIGN.md §4) is `k3model.moe`'s, re-exported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import envs
from datagen.sft import EFFORTS, HELD_OUT_HARNESS
from envs.tasks import DOMAINS
from k3model.moe import freeze_router_bias

Route = tuple[str, str]  # (domain, effort)


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


def effort_specs(budgets: Sequence[tuple[str, int, int]] | None) -> dict[str, EffortSpec] | None:
    """(effort, episode budget, turn cap) triples as `EffortSpec`s with the default length terms;
    None stays None (the defaults, `EFFORT_SPECS`)."""
    if budgets is None:
        return None
    for e, _, _ in budgets:
        if e not in EFFORTS:
            raise ValueError(f"unknown effort {e!r} in budgets: choose from {EFFORTS}")
    return {e: EffortSpec(budget_tokens=b, length_coef=EFFORT_SPECS[e].length_coef, turn_tokens=t)
            for e, b, t in budgets}


def scaled_budgets(budgets: Sequence[tuple[str, int, int]] | None,
                   scale: float) -> tuple[tuple[str, int, int], ...] | None:
    """`budgets` ((effort, episode budget, turn cap) triples; None: `EFFORT_SPECS`') with every budget
    and turn cap times `scale` (0 < scale ≤ 1, rounded, at least one token): a quick run's shorter
    episodes, e.g. a short check of a profile's lineage on a new host. Scale 1 returns `budgets` as
    given. Figures measured at different scales are not comparable."""
    if not 0 < scale <= 1:
        raise ValueError(f"budget scale {scale} is not in (0, 1]")
    if scale == 1:
        return None if budgets is None else tuple(budgets)
    base = budgets if budgets is not None else [(e, s.budget_tokens, s.turn_tokens) for e, s in EFFORT_SPECS.items()]
    return tuple((e, max(1, round(b * scale)), max(1, round(t * scale))) for e, b, t in base)


def check_route(domain: str, effort: str) -> None:
    """A ValueError naming the valid values, for an unknown domain or effort."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}: choose one of {', '.join(DOMAINS)}")
    if effort not in EFFORTS:
        raise ValueError(f"unknown effort {effort!r}: choose one of {', '.join(EFFORTS)}")


def routes(domains: Sequence[str] = DOMAINS, efforts: Sequence[str] = EFFORTS) -> list[Route]:
    """Every (domain, effort) pair, domain-major: the nine specialists by default."""
    return [(d, e) for d in domains for e in efforts]


def partition_key(route: Route) -> str:
    """The Dagster MultiPartitions key of a route: "domain|effort" (dimensions in name order)."""
    return f"{route[0]}|{route[1]}"


def training_harnesses(harnesses: Sequence[str] | None = None) -> tuple[str, ...]:
    """The harness styles training may use: None = every harness but `HELD_OUT_HARNESS`; a list is
    checked (known names, not the held-out one) and returned as a tuple."""
    if harnesses is None:
        return envs.harness_split(HELD_OUT_HARNESS)[0]
    names = tuple(harnesses)
    if not names:
        raise ValueError("harnesses must name at least one harness (or be None for the training ones)")
    for name in names:
        if name not in envs.HARNESSES:
            raise ValueError(f"unknown harness {name!r}: choose from {envs.HARNESSES}")
        if name == HELD_OUT_HARNESS:
            raise ValueError(f"harness {HELD_OUT_HARNESS!r} is held out of all main-lineage training (claim 7): "
                             "drop it from harnesses")
    return names


__all__ = ["DOMAINS", "EFFORTS", "EFFORT_SPECS", "HELD_OUT_HARNESS", "EffortSpec", "Route", "check_route",
           "effort_specs", "freeze_router_bias", "scaled_budgets", "partition_key", "routes", "training_harnesses"]
