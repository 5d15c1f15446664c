"""Cross-harness transfer (DESIGN.md §5 claim 7; research/posttrain-anchors.md §3): does RL on several
harness styles carry over to a style it never trained on?

One fold, held-out harness h (of `envs.HARNESSES`):
- general: GRPO (`k3model.train.grpo.train`) from the SFT policy on one domain at one effort, its
  episodes rendered round-robin in the four other harnesses (three when h is not
  `datagen.sft.HELD_OUT_HARNESS`: that one is reserved by the main lineage and never trained on);
- single-harness control: the same run (same config: the same steps, groups and episode budgets,
  i.e. the same rollout budget) in one of those four styles only;
- each trained policy is evaluated (`k3model.train.evaluate`) on the same held-out tasks in its own
  training harness(es) ("in-harness") and in h ("held-out"); the figure is
      transfer = success_held_out / success_in_harness
  with a 95 % interval, and each harness's unparseable-action rate (turns in which the env found no
  readable call) beside it;
- the SFT policy itself is evaluated the same way (`evaluate_sft`: the same tasks, the general arm's
  harnesses and h), so claim 7 can form the transfer of the RL *gain*,
  (held_out − sft_held_out) / (in_harness − sft_in_harness) (assets/claims.py).

The interval of a ratio of two binomial proportions p₁ = s₁/n₁, p₂ = s₂/n₂ is Katz's log interval
    log(p₁/p₂) ± z·√(1/s₁ − 1/n₁ + 1/s₂ − 1/n₂)
with 0.5 added to s and n of a count that is 0 (the usual continuity correction); the ratio is
undefined (None) when the in-harness success is 0.

Caveat the report carries: the SFT policy was trained on every harness but `datagen.sft.
HELD_OUT_HARNESS`, so only the fold that holds that one out is held out of SFT too; in other folds
only RL never saw h (`FoldResult.sft_saw_held_out`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

import envs
from k3model.checkpoint import load_model
from k3model.train.effort import HELD_OUT_HARNESS
from k3model.train.evaluate import evaluate_together
from k3model.train.flops import counting
from k3model.train.grpo import train as grpo_train
from k3model.train.stats import katz_ratio as ratio_interval  # Katz's interval (module docstring), re-exported


@dataclass
class Arm:
    """One trained policy of a fold, evaluated in its training harness(es) and in the held-out one."""
    name: str  # "general" or "single"
    harnesses: tuple[str, ...]
    checkpoint_dir: Path
    in_harness: dict  # EvalReport.as_metadata()
    held_out: dict
    train_metrics: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)

    def transfer(self) -> tuple[float | None, float, float]:
        return ratio_interval(self.held_out["successes"], self.held_out["n"],
                              self.in_harness["successes"], self.in_harness["n"])

    def as_metadata(self) -> dict[str, float | str]:
        ratio, lo, hi = self.transfer()
        out: dict[str, float | str] = {
            "harnesses": ",".join(self.harnesses),
            "in_harness/success_rate": self.in_harness["success_rate"], "in_harness/n": self.in_harness["n"],
            "held_out/success_rate": self.held_out["success_rate"], "held_out/n": self.held_out["n"],
            "transfer": ratio if ratio is not None else "undefined (no in-harness success)",
            "transfer_ci95_low": lo, "transfer_ci95_high": hi if math.isfinite(hi) else "inf",
            "held_out/unparseable_rate": self.held_out["unparseable_rate"],
            "in_harness/unparseable_rate": self.in_harness["unparseable_rate"]}
        for report in (self.in_harness, self.held_out):
            for key, value in report.items():
                if key.startswith("harness/") and key.endswith(("/unparseable_rate", "/success_rate")):
                    out[key] = value
        return out


@dataclass
class FoldResult:
    held_out: str
    domain: str
    effort: str
    general: Arm
    single: Arm
    sft_saw_held_out: bool
    # The SFT policy on the same tasks, in the general arm's harnesses and in the held-out one
    # (EvalReport.as_metadata() each; `evaluate_sft`), when it was scored.
    sft: dict[str, dict] | None = None

    def as_metadata(self) -> dict[str, float | str]:
        out: dict[str, float | str] = {"held_out": self.held_out, "domain": self.domain, "effort": self.effort,
                                       "sft_saw_held_out": str(self.sft_saw_held_out)}
        for arm in (self.general, self.single):
            out.update({f"{arm.name}/{k}": v for k, v in arm.as_metadata().items()})
        for where, report in (self.sft or {}).items():
            out.update({f"sft/{where}/success_rate": report["success_rate"], f"sft/{where}/n": report["n"]})
        return out


def evaluate_sft(policy_checkpoint: str | Path, tokenizer, folds: Sequence[str], *, effort: str,
                 eval_tasks: Sequence, eval_specs: dict | None = None) -> dict[str, dict[str, dict]]:
    """The SFT policy as each fold's arms are scored (`train_arm`): greedy on `eval_tasks` in the fold's
    training harnesses (round-robin, the general arm's) and in its held-out harness, all folds in one
    batched decode. Returns {held-out harness: {"in_harness": metadata, "held_out": metadata}}."""
    if not eval_tasks:
        raise ValueError("eval_tasks is empty: pass the held-out envs tasks the arms are scored on")
    model = load_model(policy_checkpoint, "cuda" if torch.cuda.is_available() else "cpu", frozen_router=True)[0].eval()
    calls = {}
    for h in folds:
        calls[f"{h}|in_harness"] = (list(eval_tasks), effort, list(fold_harnesses(h)[0]))
        calls[f"{h}|held_out"] = (list(eval_tasks), effort, [h])
    reports = evaluate_together(model, tokenizer, calls, eval_specs)
    return {h: {where: reports[f"{h}|{where}"].as_metadata() for where in ("in_harness", "held_out")} for h in folds}


def fold_harnesses(held_out: str, single: str | None = None) -> tuple[tuple[str, ...], str]:
    """(the fold's training harnesses, the single-harness control's one). `effort.HELD_OUT_HARNESS`
    is reserved by the main lineage (grpo.train refuses it), so a fold that holds out another style
    trains on the three remaining ones."""
    if held_out not in envs.HARNESSES:
        raise ValueError(f"held_out must be one of {envs.HARNESSES}, got {held_out!r}")
    train = tuple(h for h in envs.HARNESSES if h not in (held_out, HELD_OUT_HARNESS))
    single = single or train[0]
    if single not in train:
        raise ValueError(f"the single-harness control must train on one of the fold's harnesses {train}, "
                         f"not {single!r}")
    return train, single


def train_arm(grpo_cfg, policy_checkpoint: str | Path, tokenizer, out_dir: str | Path, *, name: str,
              harnesses: Sequence[str], held_out: str, domain: str, effort: str, eval_tasks: Sequence,
              train_tasks: Sequence | None = None, eval_specs: dict | None = None,
              log_fn: Callable[[int, dict], None] | None = None) -> Arm:
    """GRPO from the policy on `harnesses` only (FLOPs counted), then greedy evaluation on the same
    tasks in those harnesses (round-robin) and in `held_out`."""
    if not eval_tasks:
        raise ValueError("eval_tasks is empty: pass the held-out envs tasks both arms are scored on")
    if held_out in harnesses:
        raise ValueError(f"the held-out harness {held_out!r} is among the arm's training harnesses {tuple(harnesses)}")
    with counting() as flops:
        result = grpo_train(grpo_cfg, policy_checkpoint, tokenizer, out_dir, domain=domain, effort=effort,
                            harnesses=tuple(harnesses), tasks=train_tasks, log_fn=log_fn)
    # Evaluated where it trained (grpo: the GPU when there is one).
    model = load_model(result.checkpoint_dir, "cuda" if torch.cuda.is_available() else "cpu",
                       frozen_router=True)[0].eval()
    # In-harness and held-out in one batched decode (the same figures as two evaluate() calls).
    reports = evaluate_together(model, tokenizer, {"in": (list(eval_tasks), effort, list(harnesses)),
                                                   "out": (list(eval_tasks), effort, [held_out])}, eval_specs)
    return Arm(name, tuple(harnesses), Path(result.checkpoint_dir), reports["in"].as_metadata(),
               reports["out"].as_metadata(),
               train_metrics={**result.metrics, **{f"flops/{k}": v for k, v in flops.as_dict().items()}},
               history=list(result.history))


def run_fold(grpo_cfg, policy_checkpoint: str | Path, tokenizer, out_dir: str | Path, *, held_out: str,
             domain: str, effort: str, eval_tasks: Sequence, train_tasks: Sequence | None = None,
             single: str | None = None, eval_specs: dict | None = None) -> FoldResult:
    """Train the general and the single-harness arm of one fold and evaluate both (module docstring)."""
    train_h, single_h = fold_harnesses(held_out, single)
    arms = [train_arm(grpo_cfg, policy_checkpoint, tokenizer, Path(out_dir) / name, name=name, harnesses=h,
                      held_out=held_out, domain=domain, effort=effort, eval_tasks=eval_tasks,
                      train_tasks=train_tasks, eval_specs=eval_specs)
            for name, h in (("general", train_h), ("single", (single_h,)))]
    return FoldResult(held_out, domain, effort, arms[0], arms[1], sft_saw_held_out=held_out != HELD_OUT_HARNESS)
