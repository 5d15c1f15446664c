"""The equal-compute control for MOPD (issue 19; research/posttrain-anchors.md §2.4 "OPD vs RL at equal
compute, in counted FLOPs"): one generalist GRPO policy trained over every domain and effort with as
many FLOPs as the nine specialists' RL and the MOPD distillation spent together.

    budget = FLOPs(specialists' RL) + FLOPs(MOPD)                 (k3model.train.flops.counting)
    policy ← sft_policy
    repeat, cycling over the routes (domain, effort):
        policy ← grpo.train(cfg with `steps_per_turn` steps, policy, domain, effort)
    until the FLOPs counted in those calls reach the budget

Each call is a GRPO run of its own (`grpo.train` trains one domain at one effort), so the optimizer
moments restart at every turn of the cycle; the policy's weights carry over. The counted FLOPs
include every rollout, π_old and training pass of each call (the same counter MOPD's are counted
with). The last turn may overshoot the budget by one turn's FLOPs: `flops` and `budget` are both
reported, and the comparison should use the ratio.

Reading the comparison (student − generalist, `assets.distill.mopd_metadata` and
benchmarks/recipes/mopd_powered.py): a verdict only where the 95 % interval excludes 0; where it does
not, the power to see a true difference of ±CONTROL_EFFECT is printed beside it, and below 0.8 the
comparison reads "underpowered", never "no difference".
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from k3model.train.effort import Route
from k3model.train.flops import FlopCounter, counting
from k3model.train.grpo import train as grpo_train

# The difference the control comparison is powered at: a third of the +15-point gain claim 3 is
# powered at (assets.claims.POWERED_GAIN), fixed before any control was read.
CONTROL_EFFECT = 0.05


@dataclass
class ControlResult:
    checkpoint_dir: Path
    flops: dict[str, float]
    budget: float
    turns: list[dict] = field(default_factory=list)  # route, steps, FLOPs and the call's headline metrics

    @property
    def history(self) -> list[dict]:
        return self.turns


def generalist_control(grpo_cfg, policy_checkpoint: str | Path, tokenizer, out_dir: str | Path, *,
                       flop_budget: float, routes: Sequence[Route], steps_per_turn: int = 1,
                       tasks: Mapping[Route, Sequence] | None = None, max_turns: int = 1000,
                       log_fn: Callable[[int, dict], None] | None = None) -> ControlResult:
    """Train the generalist until `flop_budget` counted FLOPs are spent (module docstring)."""
    if flop_budget <= 0:
        raise ValueError(f"flop_budget must be > 0 (the specialists' + MOPD's counted FLOPs), got {flop_budget}")
    if not routes or steps_per_turn < 1:
        raise ValueError("give at least one route and steps_per_turn ≥ 1")
    out_dir = Path(out_dir)
    cfg = replace(grpo_cfg, steps=steps_per_turn)
    total = FlopCounter(0, 0)
    policy = Path(policy_checkpoint)
    turns: list[dict] = []
    while total.as_dict()["total"] < flop_budget:
        if len(turns) >= max_turns:
            raise ValueError(f"the budget of {flop_budget:.3g} FLOPs was not spent in {max_turns} turns: "
                             "raise max_turns or steps_per_turn")
        domain, effort = routes[len(turns) % len(routes)]
        with counting() as c:
            result = grpo_train(cfg, policy, tokenizer, out_dir / f"turn{len(turns):03d}", domain=domain,
                                effort=effort, tasks=None if tasks is None else tasks[(domain, effort)])
        for kind, value in c.totals.items():
            total.add(kind, value)
        if turns:  # only the newest turn's checkpoint is needed (the first policy is the caller's)
            shutil.rmtree(policy.parent, ignore_errors=True)
        policy = Path(result.checkpoint_dir)
        row = {"turn": len(turns), "domain": domain, "effort": effort, "flops": sum(c.totals.values()),
               "flops_total": total.as_dict()["total"],
               **{k: v for k, v in result.metrics.items() if k in ("rl/success/mean", "rl/tokens_per_episode/mean")}}
        turns.append(row)
        if log_fn is not None:
            log_fn(len(turns), {f"control/{k}": v for k, v in row.items() if isinstance(v, (int, float))})
    return ControlResult(policy, total.as_dict(), flop_budget, turns)
