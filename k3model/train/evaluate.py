"""Task success of a policy checkpoint: envs episodes played by the model, scored by the verifiers.

    report = evaluate(model, tokenizer, envs.task_set("general_tasks", 32, seed=0), "low")
    report.success_rate, report.ci95, report.n, report.mean_policy_tokens
    report.as_metadata()        # flat {str: number | str} for asset metadata and MLflow

What an episode is (DESIGN.md §5 claim 3, §8):
- The prompt is rendered exactly as the SFT rows are (`k3model.train.rollout.sft_format`, built
  from `datagen.sft.turn_tokens`): <|bos|><|system|><|effort_E|>{first observation}<|end|><|assistant|>,
  tool results as <|tool_result|>…<|tool_result_end|><|assistant|>, each turn ending at <|end|>;
  the env sees a turn's text after its scratchpad.
- Budgets are the RL ones of the effort (`k3model.train.effort.EFFORT_SPECS`): `turn_tokens` per
  turn and `budget_tokens` per episode; an episode that spends its budget, its env's step/token
  budget or the model's context without finishing scores 0, as in RL.
- The reward is the task's verifier's (1 only when every goal holds and nothing else changed).
- Many episodes play at once (`rollout.play_tasks`: continuous batching, 64 live, refilled as
  episodes end), each task's samples side by side.

Figures: success rate s/n over all n = tasks × samples episodes, with the Wilson score interval at
95 % (z = 1.96):

    p̂ = s/n,   centre = (p̂ + z²/2n) / (1 + z²/n),   half = z·√(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n)

(with samples > 1 the episodes of one task are not independent, so the interval is narrower than
the truth: use samples = 1 for the held-out comparisons, samples = 8 for pass rates per task);
successes per task, per family and per harness; the unparseable-action rate (the fraction of
policy turns in which the env found no readable call); mean policy (generated) tokens per episode;
how episodes ended; wall time and generated tokens per second.

This module is the one evaluator: `evaluate` (one call), `evaluate_together` (many calls, each
effort's in one batched decode), `summarize` and `per_harness`. The modules that choose tasks name
them and call it: `ladder.evaluate_policy` (a held-out `recipes.EvalPlan`: sft_policy, the base model,
the specialists), `ladder.measure_ladder` (pass@k at temperature 1), `mopd.evaluate_routes` (the
student on every route), `transfer.train_arm` (in and out of the held-out harness), `grpo.train`
(its periodic held-out score). They sit with their task choice because the imports point that way
(ladder, mopd, transfer, grpo → evaluate): this module names no task set.

No Dagster, Ray or MLflow here. Legend: n episodes, s successes.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

import envs
from k3model.engine import SamplingConfig
from k3model.model import K3Model
from k3model.train.effort import EFFORT_SPECS, EFFORTS, EffortSpec, training_harnesses
from k3model.train.rollout import Episode, play_tasks, sft_format
from k3model.train.stats import wilson as wilson_interval  # noqa: F401  (re-exported: the interval of `ci95`)

NO_CALL = "no tool call found"  # how envs.Env.step's parse error for a turn without a readable call starts


@dataclass
class EvalReport:
    effort: str
    n: int  # episodes
    successes: int
    samples: int  # episodes per task
    temperature: float
    per_task: dict[str, int] = field(default_factory=dict)  # task id → successes out of `samples`
    per_family: dict[str, tuple[int, int]] = field(default_factory=dict)  # family → (successes, episodes)
    per_domain: dict[str, tuple[int, int]] = field(default_factory=dict)
    per_harness: dict[str, dict[str, float]] = field(default_factory=dict)  # success_rate, n, unparseable_rate
    unparseable_rate: float = 0.0
    mean_policy_tokens: float = 0.0
    mean_turns: float = 0.0
    stop_reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    policy_tokens_per_s: float = 0.0

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else 0.0

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.n)

    def as_metadata(self, prefix: str = "") -> dict[str, float | int | str]:
        """Flat figures (numbers, and the effort as a string) under `prefix` (e.g. "eval/")."""
        lo, hi = self.ci95
        out: dict[str, float | int | str] = {
            "effort": self.effort, "n": self.n, "successes": self.successes, "samples": self.samples,
            "temperature": self.temperature, "success_rate": self.success_rate, "ci95_low": lo, "ci95_high": hi,
            "unparseable_rate": self.unparseable_rate, "mean_policy_tokens": self.mean_policy_tokens,
            "mean_turns": self.mean_turns, "seconds": self.seconds, "policy_tokens_per_s": self.policy_tokens_per_s,
            "n_tasks": len(self.per_task)}
        if self.samples > 1 and self.per_task:
            # pass@k with k = samples: the share of tasks solved by at least one of their k episodes
            # (beside pass@1 = success_rate, so sharpening — pass@1 up, pass@k flat — shows as such).
            out[f"pass_at_{self.samples}"] = sum(v > 0 for v in self.per_task.values()) / len(self.per_task)
        for name, (s, n) in sorted(self.per_family.items()):
            out[f"family/{name}/success_rate"] = s / n if n else 0.0
            out[f"family/{name}/n"] = n
        for name, (s, n) in sorted(self.per_domain.items()):
            out[f"domain/{name}/success_rate"] = s / n if n else 0.0
            out[f"domain/{name}/n"] = n
        for name, figures in sorted(self.per_harness.items()):
            for key, value in figures.items():
                out[f"harness/{name}/{key}"] = value
        for reason, count in sorted(self.stop_reasons.items()):
            out[f"stop/{reason}"] = count
        return {prefix + k: v for k, v in out.items()}


def resolve_harnesses(n_tasks: int, harness: str | Sequence[str] | None) -> list[str]:
    """One harness per task: all in `harness` (a name), round-robin over a list of names, or (None)
    round-robin over the training harnesses (never the held-out one)."""
    names = training_harnesses() if harness is None else (harness,) if isinstance(harness, str) else tuple(harness)
    if not names:
        raise ValueError("harness must name at least one harness (or be None for the training harnesses)")
    for name in names:
        if name not in envs.HARNESSES:
            raise ValueError(f"unknown harness {name!r}: choose from {envs.HARNESSES}")
    return [names[i % len(names)] for i in range(n_tasks)]


def summarize(tasks: Sequence, played: list[tuple[int, str, Episode]], effort: str, samples: int,
              temperature: float, seconds: float) -> EvalReport:
    """The report of played episodes (`rollout.play_tasks`' output on `tasks`)."""
    success = [1 if ep.reward >= 1.0 else 0 for _, _, ep in played]
    report = EvalReport(effort=effort, n=len(played), successes=sum(success), samples=samples,
                        temperature=temperature, seconds=seconds)
    family: dict[str, list[int]] = {}
    domain: dict[str, list[int]] = {}
    harness: dict[str, list[int]] = {}  # successes, episodes, turns, unparseable turns
    reasons: Counter = Counter()
    tokens = turns = seen = bad = 0
    for (i, h, ep), ok in zip(played, success):
        task = tasks[i]
        report.per_task[task.id] = report.per_task.get(task.id, 0) + ok
        for table, key in ((family, task.family), (domain, task.domain)):
            acc = table.setdefault(key, [0, 0])
            acc[0] += ok
            acc[1] += 1
        n_bad = sum(1 for t in ep.turns if t.error is not None and t.error.startswith(NO_CALL))
        # A turn cut off by the episode budget never reached the env: it is neither parsed nor not.
        n_seen = len(ep.turns) - (ep.stop_reason == "budget")
        acc = harness.setdefault(h, [0, 0, 0, 0])
        acc[0] += ok
        acc[1] += 1
        acc[2] += n_seen
        acc[3] += n_bad
        reasons[ep.stop_reason] += 1
        tokens += ep.n_generated
        turns += len(ep.turns)
        seen += n_seen
        bad += n_bad
    report.per_family = {k: (v[0], v[1]) for k, v in sorted(family.items())}
    report.per_domain = {k: (v[0], v[1]) for k, v in sorted(domain.items())}
    report.per_harness = {h: {"success_rate": v[0] / v[1], "n": v[1], "unparseable_rate": v[3] / max(v[2], 1)}
                          for h, v in sorted(harness.items())}
    report.unparseable_rate = bad / max(seen, 1)
    report.mean_policy_tokens = tokens / max(len(played), 1)
    report.mean_turns = turns / max(len(played), 1)
    report.stop_reasons = dict(sorted(reasons.items()))
    report.policy_tokens_per_s = tokens / max(seconds, 1e-9)
    return report


@torch.no_grad()
def evaluate(model, tokenizer, tasks: Sequence, effort: str, *, samples: int = 1, temperature: float = 0.0,
             harness: str | Sequence[str] | None = None, seed: int = 0, max_episodes_per_batch: int = 64,
             specs=None) -> EvalReport:
    """Play `samples` episodes of each task (envs `Task`s) at `effort` and score them; see the module
    docstring. `harness`: one name, a list (round-robin over the tasks) or None (the training
    harnesses, round-robin). `specs` overrides `effort.EFFORT_SPECS` (the per-effort budgets)."""
    if effort not in EFFORTS:
        raise ValueError(f"unknown effort {effort!r}: choose from {EFFORTS}")
    if not tasks:
        raise ValueError("tasks is empty: pass envs tasks (e.g. envs.task_set(domain, n, seed))")
    if samples < 1:
        raise ValueError(f"samples must be ≥ 1, got {samples}")
    if samples > 1 and temperature == 0:
        raise ValueError("samples > 1 at temperature 0 repeats one greedy episode: set temperature > 0")
    spec = (specs or EFFORT_SPECS)[effort]
    cfg = SamplingConfig(max_new_tokens=spec.turn_tokens, temperature=temperature)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    t0 = time.perf_counter()
    played = play_tasks(model, sft_format(tokenizer, effort), list(tasks), resolve_harnesses(len(tasks), harness),
                        cfg, samples=samples, episode_budget=spec.budget_tokens, generator=generator,
                        max_episodes_per_batch=max_episodes_per_batch)
    return summarize(list(tasks), played, effort, samples, temperature, time.perf_counter() - t0)


@torch.no_grad()
def evaluate_together(model: K3Model, tokenizer, calls: Mapping, specs: Mapping[str, EffortSpec] | None = None,
                      seed: int = 0, max_episodes_per_batch: int = 64) -> dict:
    """`evaluate(model, tokenizer, tasks, effort, harness=harness, specs=specs)`
    for every `calls[name] = (tasks, effort, harness)` (greedy, one sample; `harness` as evaluate
    takes it: a name, a list round-robin over the tasks, or None for the training harnesses), with
    the calls of one effort played in one batch (of at most `max_episodes_per_batch`) instead of one
    batch a call. The engine is batch invariant (greedy rows decode the same tokens whatever shares their batch:
    tests/k3model/test_engine.py), so each report equals its own call's but for `seconds` (here the
    wall time of the effort's shared batch, and `policy_tokens_per_s` against it)."""

    specs = dict(specs or EFFORT_SPECS)
    for name, (ts, effort, _) in calls.items():
        if effort not in specs:
            raise ValueError(f"{name}: no budget for effort {effort!r} (specs has {sorted(specs)})")
        if not ts:
            raise ValueError(f"{name} has no tasks to evaluate")
    device = next(model.parameters()).device
    reports: dict = {}
    for effort in dict.fromkeys(c[1] for c in calls.values()):
        names = [n for n, c in calls.items() if c[1] == effort]
        flat = [t for n in names for t in calls[n][0]]
        harnesses = [h for n in names for h in resolve_harnesses(len(calls[n][0]), calls[n][2])]
        spec = specs[effort]
        # evaluate()'s generator (unused at temperature 0, kept so the calls match).
        generator = torch.Generator(device=device).manual_seed(seed)
        t0 = time.perf_counter()
        played = play_tasks(model, sft_format(tokenizer, effort), flat, harnesses,
                            SamplingConfig(max_new_tokens=spec.turn_tokens, temperature=0.0),
                            episode_budget=spec.budget_tokens, generator=generator,
                            max_episodes_per_batch=max_episodes_per_batch)
        seconds = time.perf_counter() - t0
        start = 0
        for n in names:
            count = len(calls[n][0])
            mine = [(i - start, h, ep) for i, h, ep in played if start <= i < start + count]
            reports[n] = summarize(list(calls[n][0]), mine, effort, 1, 0.0, seconds)
            start += count
    return {n: reports[n] for n in calls}


def per_harness(evals: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Success rate and unparseable-action rate per harness over every (domain, effort) cell."""
    acc: dict[str, list[float]] = {}
    for figures in evals.values():
        harnesses = {k.split("/")[1] for k in figures if k.startswith("harness/")}
        for h in harnesses:
            n = figures[f"harness/{h}/n"]
            a = acc.setdefault(h, [0.0, 0.0, 0.0])
            a[0] += figures[f"harness/{h}/success_rate"] * n
            a[1] += figures[f"harness/{h}/unparseable_rate"] * n
            a[2] += n
    return {h: {"success_rate": s / n, "unparseable_rate": u / n, "n": int(n)} for h, (s, u, n) in sorted(acc.items())}
