"""The RL task ladder: which tasks each specialist trains on, chosen at the SFT policy's edge of
competence (DESIGN.md §5 claim 3; research/posttrain-anchors.md §6).

RL learns only from groups whose rewards differ: a family the policy never solves (or always
solves) gives zero-variance groups and no gradient. So, per (domain, effort), the SFT policy plays
`tasks_per_family` tasks of every candidate family `samples` = 8 times at temperature 1, and

    pass(f, e) = successes / episodes                    per family f at effort e
    selected(d, e) = { f of domain d : lo ≤ pass(f, e) ≤ hi }      (lo, hi) = (0.1, 0.9)

When no family of a domain lies in the band, the cell is marked `in_band = False` and the family
nearest to the band is taken (a pass rate above 0 first: some signal beats none) — the ladder says
so rather than pretending. Each cell also reports the fraction of its tasks that are informative at
G = 8 (0 < successes < 8), the share of groups RL will keep.

Seeds (disjoint ranges; SFT demonstrations use ≥ 1,000,000, datagen.sft):
- `RL_SEED_BASE` (0 …): the ladder's measurement and the RL prompts;
- `EVAL_SEED_BASE` (500,000 …): held-out tasks for the specialists' and sft_policy's evaluation,
  of the selected families (`eval_tasks`, `heldout_tasks`) and of the domain's hard split
  (`hard_tasks`: the families where the scratchpad does real work — arithmetic, lookups, code — for
  max ≥ low). A small family repeats its prompts across seeds (echo_word: 20 words × 3 phrasings),
  so `heldout_tasks` skips every task whose instruction is an RL prompt's: other seeds alone would
  still evaluate on what RL trained on.

No Dagster here: `LadderReport.as_metadata()` and `.table()` are what the rl_tasks asset shows.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

import envs
from datagen.sft import SFT_FAMILIES
from envs.tasks import Task, get_family
from k3model.train.effort import DOMAINS, EFFORTS
from k3model.train.evaluate import evaluate, evaluate_together
from k3model.train.recipes import EVAL_SEED_BASE, RL_SEED_BASE, EvalPlan
PASS_BAND = (0.1, 0.9)
HARD_FAMILIES = {"general_tasks": ("arith_word",), "general_agents": ("gmail_label",),
                 "coding_agents": ("write_function",)}


def check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}: choose from {DOMAINS}")


def domain_families(domain: str, families: Sequence[str] = SFT_FAMILIES) -> tuple[str, ...]:
    """The candidate families of a domain: those the SFT policy was shown (datagen.sft.SFT_FAMILIES)."""
    check_domain(domain)
    return tuple(f for f in families if get_family(f).domain == domain)


def tasks_of(families: Sequence[str], n_per_family: int, seed_base: int) -> list[Task]:
    """n tasks of each family, seeds seed_base … seed_base + n − 1, family-major."""
    if n_per_family < 1:
        raise ValueError(f"n_per_family must be ≥ 1, got {n_per_family}")
    return [envs.generate(f, seed_base + i) for f in families for i in range(n_per_family)]


def plan_tasks(plan: EvalPlan, domain: str) -> list[Task]:
    """The held-out tasks `plan` scores at `domain`: `plan.tasks_per_family` of each of its families
    of that domain, seeds from `plan.seed`."""
    return tasks_of(domain_families(domain, plan.families), plan.tasks_per_family, plan.seed)


def evaluate_policy(model, tokenizer, plan: EvalPlan, cells: list[tuple[str, str]] | None = None) -> dict[str, dict]:
    """`evaluate` on the plan's tasks: {"<domain>/<effort>": EvalReport.as_metadata()}
    for every (domain, effort) of the plan, or only `cells`. Greedy single episodes, so the cells of
    one effort share one batched decode (`evaluate.evaluate_together`: the same figures
    as one `evaluate` call per cell, but `seconds`, the shared batch's wall time)."""
    cells = cells or [(d, e) for d in plan.domains for e in plan.efforts]
    calls = {f"{domain}/{effort}": (plan_tasks(plan, domain), effort, None) for domain, effort in cells}
    reports = evaluate_together(model, tokenizer, calls, plan.specs(), seed=plan.seed,
                                max_episodes_per_batch=plan.max_episodes_per_batch)
    return {name: report.as_metadata() for name, report in reports.items()}


def heldout_tasks(families: Sequence[str], n_per_family: int, exclude: Sequence[Task] = (),
                  seed_base: int = EVAL_SEED_BASE) -> list[Task]:
    """n tasks of each family from seed_base on, family-major, skipping any whose instruction equals
    one of `exclude`'s of the same family (the RL prompts): held out in content, not only in seed."""
    if n_per_family < 1:
        raise ValueError(f"n_per_family must be ≥ 1, got {n_per_family}")
    seen = {(t.family, t.instruction) for t in exclude}
    out: list[Task] = []
    for family in families:
        kept, seed = 0, seed_base
        # A family with fewer distinct prompts than asked for would loop forever: stop after 100 n.
        while kept < n_per_family:
            if seed - seed_base >= 100 * n_per_family:
                raise ValueError(f"{family}: fewer than {n_per_family} held-out tasks differ from the RL prompts; "
                                 "ask for fewer held-out tasks or fewer RL prompts")
            task = envs.generate(family, seed)
            seed += 1
            if (family, task.instruction) not in seen:
                out.append(task)
                kept += 1
    return out


def default_rl_tasks(domain: str, n_per_family: int = 16) -> list[Task]:
    """RL prompts of every candidate family of the domain (used when no ladder was measured)."""
    return tasks_of(domain_families(domain), n_per_family, RL_SEED_BASE)


def hard_tasks(domain: str, n_per_family: int = 16) -> list[Task]:
    check_domain(domain)
    return tasks_of(HARD_FAMILIES[domain], n_per_family, EVAL_SEED_BASE)


@dataclass(frozen=True)
class LadderConfig:
    tasks_per_family: int = 4
    samples: int = 8  # G: the group size the pass rates are measured at
    temperature: float = 1.0
    band: tuple[float, float] = PASS_BAND
    seed: int = 0
    domains: tuple[str, ...] = DOMAINS
    efforts: tuple[str, ...] = EFFORTS
    families: tuple[str, ...] = SFT_FAMILIES

    def __post_init__(self) -> None:
        if self.tasks_per_family < 1 or self.samples < 2:
            raise ValueError(f"need tasks_per_family ≥ 1 and samples ≥ 2 (pass rates of groups), got "
                             f"{self.tasks_per_family}, {self.samples}")
        lo, hi = self.band
        if not 0 <= lo < hi <= 1:
            raise ValueError(f"band must satisfy 0 ≤ lo < hi ≤ 1, got {self.band}")
        for d in self.domains:
            check_domain(d)
        for e in self.efforts:
            if e not in EFFORTS:
                raise ValueError(f"unknown effort {e!r}: choose from {EFFORTS}")


@dataclass
class LadderCell:
    domain: str
    effort: str
    families: dict[str, tuple[int, int]]  # family → (successes, episodes)
    selected: list[str]
    in_band: bool
    informative_frac: float  # tasks with 0 < successes < samples, over the selected families
    tokens: float  # mean policy tokens per episode at this effort (all the domain's families)

    @property
    def pass_rate(self) -> float:
        s = sum(self.families[f][0] for f in self.selected)
        n = sum(self.families[f][1] for f in self.selected)
        return s / n if n else 0.0


def select_families(rates: dict[str, tuple[int, int]], band: tuple[float, float]) -> tuple[list[str], bool]:
    """The families whose pass rate lies in the band; else the one nearest to it (pass > 0 first)."""
    lo, hi = band
    p = {f: s / n for f, (s, n) in rates.items() if n}
    inside = [f for f in rates if f in p and lo <= p[f] <= hi]
    if inside:
        return inside, True
    if not p:
        return [], False
    nearest = min(p, key=lambda f: (p[f] == 0.0, max(lo - p[f], p[f] - hi, 0.0)))
    return [nearest], False


@dataclass
class LadderReport:
    config: LadderConfig
    cells: list[LadderCell] = field(default_factory=list)
    seconds: float = 0.0

    def cell(self, domain: str, effort: str) -> LadderCell:
        for c in self.cells:
            if (c.domain, c.effort) == (domain, effort):
                return c
        raise ValueError(f"the ladder has no cell ({domain!r}, {effort!r}); it measured "
                         f"{[(c.domain, c.effort) for c in self.cells]}")

    def rl_tasks(self, domain: str, effort: str, n_per_family: int = 16) -> list[Task]:
        """The RL prompts of a specialist: its cell's selected families, RL seeds."""
        return tasks_of(self.cell(domain, effort).selected, n_per_family, RL_SEED_BASE)

    def eval_tasks(self, domain: str, effort: str, n_per_family: int = 16, rl_per_family: int = 16) -> list[Task]:
        """Held-out tasks of the same families (other seeds, none with an RL prompt of
        `rl_tasks(domain, effort, rl_per_family)`), for specialist vs sft_policy."""
        return heldout_tasks(self.cell(domain, effort).selected, n_per_family,
                             exclude=self.rl_tasks(domain, effort, rl_per_family))

    def table(self) -> str:
        """Markdown: one row per (domain, effort), pass rate per family, the selection."""
        fams = [f for f in self.config.families]
        rows = ["| domain | effort | " + " | ".join(fams) + " | selected | pass | informative | in band |",
                "|---|---|" + "---:|" * len(fams) + "---|---:|---:|---|"]
        for c in self.cells:
            rates = [f"{c.families[f][0] / c.families[f][1]:.2f}" if f in c.families else "" for f in fams]
            rows.append(f"| {c.domain} | {c.effort} | " + " | ".join(rates) +
                        f" | {', '.join(c.selected)} | {c.pass_rate:.2f} | {c.informative_frac:.2f} | "
                        f"{'yes' if c.in_band else 'NO'} |")
        return "\n".join(rows)

    def as_metadata(self) -> dict[str, float | str]:
        out: dict[str, float | str] = {"seconds": self.seconds, "samples": self.config.samples,
                                       "tasks_per_family": self.config.tasks_per_family,
                                       "band": f"{self.config.band[0]}–{self.config.band[1]}"}
        for c in self.cells:
            key = f"{c.domain}/{c.effort}"
            out[f"{key}/pass_rate"] = c.pass_rate
            out[f"{key}/selected"] = ",".join(c.selected)
            out[f"{key}/in_band"] = float(c.in_band)
            out[f"{key}/informative_frac"] = c.informative_frac
            out[f"{key}/tokens"] = c.tokens
            for f, (s, n) in c.families.items():
                out[f"{key}/family/{f}"] = s / n
        return out

    def to_json(self) -> dict:
        return {"config": asdict(self.config), "seconds": self.seconds,
                "cells": [{**asdict(c), "pass_rate": c.pass_rate} for c in self.cells]}

    @classmethod
    def from_json(cls, d: dict) -> LadderReport:
        """The report `to_json` wrote (the rl_tasks asset's output, read by each specialist)."""
        c = d["config"]
        cfg = LadderConfig(**{**c, "band": tuple(c["band"]), "domains": tuple(c["domains"]),
                              "efforts": tuple(c["efforts"]), "families": tuple(c["families"])})
        cells = [LadderCell(x["domain"], x["effort"], {f: tuple(v) for f, v in x["families"].items()},
                            list(x["selected"]), x["in_band"], x["informative_frac"], x["tokens"]) for x in d["cells"]]
        return cls(cfg, cells, d.get("seconds", 0.0))


def measure_ladder(model, tokenizer, cfg: LadderConfig = LadderConfig(), harness=None, specs=None) -> LadderReport:
    """Pass rates of `model` (the SFT policy) per family and effort, and the selection per cell.
    One `evaluate` call per effort over every candidate family (batched episodes); `harness` and
    `specs` (the per-effort budgets) are evaluate's."""
    t0 = time.perf_counter()
    report = LadderReport(cfg)
    for effort in cfg.efforts:
        families = [f for d in cfg.domains for f in domain_families(d, cfg.families)]
        tasks = tasks_of(families, cfg.tasks_per_family, RL_SEED_BASE)
        r = evaluate(model, tokenizer, tasks, effort, samples=cfg.samples, temperature=cfg.temperature,
                     harness=harness, seed=cfg.seed, specs=specs)
        for domain in cfg.domains:
            rates = {f: r.per_family[f] for f in domain_families(domain, cfg.families) if f in r.per_family}
            selected, in_band = select_families(rates, cfg.band)
            chosen = [t.id for t in tasks if t.family in selected]
            informative = sum(0 < r.per_task[i] < cfg.samples for i in chosen) / max(len(chosen), 1)
            report.cells.append(LadderCell(domain, effort, rates, selected, in_band, informative,
                                           r.mean_policy_tokens))
    report.seconds = time.perf_counter() - t0
    return report
