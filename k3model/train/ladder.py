"""The RL task ladder: which tasks each specialist trains on, chosen at the SFT policy's edge of
competence and pre-registered before any RL runs (DESIGN.md §5 claim 3; research/turn3-posttrain.md
§5 "task choice"; research/posttrain-anchors.md §6).

RL learns only from groups whose rewards differ, and at this size it mostly sharpens what the
policy already does sometimes (pass@k → pass@1) rather than teaching a new skill. So, per
(domain, effort), the SFT policy plays `tasks_per_family` = T tasks of every candidate family
`samples` = G times at temperature 1 and once greedily, and per family f at effort e

    pass@1(f, e) = Σ_t c_t / (T·G)                               c_t successes of task t out of G
    pass@k(f, e) = (1/T) Σ_t [1 − C(G − c_t, k) / C(G, k)]       unbiased (Chen et al. 2021, HumanEval §2.1);
                                                                 at G = k = 8, the share of tasks with c_t ≥ 1
    greedy(f, e) = successes of one T = 0 episode per task / T
    selected(d, e) = { f of domain d : lo ≤ pass@1(f, e) ≤ hi  and  pass@k(f, e) ≥ k_min }
                     (lo, hi) = (0.2, 0.6), k = 8, k_min = 0.8      (`PASS1_BAND`, `PASS_K`, `PASS_AT_K_MIN`)

When no family of a domain meets both, the cell is marked `in_band = False` and the family nearest
to the criterion is taken, distance max(lo − pass@1, pass@1 − hi, 0) + max(k_min − pass@k, 0) (a
pass@1 above 0 first: some signal beats none) — the ladder says so rather than pretending. Each
cell also reports the fraction of its tasks that are informative at G (0 < c_t < G), the share of
groups RL will keep.

Floors and ceilings of every split (the cell's RL prompts, its held-out tasks, the domain's hard
split): the success of envs' random policy (`envs.experts.RandomPolicy`: well-formed calls of
random tools with random arguments — a stronger guesser than uniformly random tokens, which almost
never parse as a call) and of the scripted expert (the gold actions, `envs.experts.expert_policy`),
each task played once in the harness the specialist's evaluation gives it (round-robin over the
training harnesses), on the first `baseline_tasks_per_family` tasks of each family of the split.
The random policy must score 0 (a verifier a guesser passes measures nothing) and the expert ~1
(a task the gold script fails is broken); a random success is reported, never fixed by changing
the selection.

Seeds (disjoint ranges; SFT demonstrations use ≥ 1,000,000, datagen.sft):
- `RL_SEED_BASE` (0 …): the ladder's measurement and the RL prompts;
- `EVAL_SEED_BASE` (500,000 …): held-out tasks for the specialists' and sft_policy's evaluation,
  of the selected families (`eval_tasks`, `heldout_tasks`) and of the domain's hard split
  (`hard_tasks`: the families where the scratchpad does real work — arithmetic, lookups, code — for
  max ≥ low). A small family repeats its prompts across seeds (echo_word: 20 words × 3 phrasings),
  so `heldout_tasks` skips every task whose instruction is an RL prompt's: other seeds alone would
  still evaluate on what RL trained on.

No Dagster here: `LadderReport.as_metadata()`, `.table()` and `.baseline_table()` are what the
rl_tasks asset shows.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Sequence

import envs
from datagen.sft import SFT_FAMILIES
from envs.experts import expert_policy, random_policy
from envs.tasks import Task, get_family
from k3model.train.effort import DOMAINS, EFFORTS, check_route
from k3model.train.evaluate import evaluate, evaluate_together, resolve_harnesses
from k3model.train.recipes import EVAL_SEED_BASE, RL_SEED_BASE, EvalPlan
from k3model.train.stats import pass_at_k

# Pre-registered selection (research/turn3-posttrain.md §5), fixed before any specialist trains.
# pass@1 in [0.2, 0.6]: at G = 8 a group is informative (0 < c < 8) with probability
# 1 − p⁸ − (1 − p)⁸ = 0.83 at p = 0.2 and 0.98 at 0.6, and a policy at ≤ 0.6 leaves ≥ 40 points to
# gain, room for claim 3's +10. pass@8 ≥ 0.8: four tasks in five are solved at least once in eight
# samples, so the failure is a choice the policy already represents (sharpening can fix it), not a
# skill it lacks (which a sparse reward on ~2,000 episodes does not build).
PASS1_BAND = (0.2, 0.6)
PASS_K = 8
PASS_AT_K_MIN = 0.8
HARD_FAMILIES = {"general_tasks": ("arith_word",), "general_agents": ("gmail_label",),
                 "coding_agents": ("write_function",)}
# Harder instances of a family the specialists train on (claim 3's hard split: max ≥ low where
# sft_policy at low scores < 50 %); a trained family missing here has no hard split yet.
HARD_INSTANCES = {"compare_numbers": "compare_numbers_close"}
SPLITS = ("rl", "heldout", "hard")
BASELINES = ("random", "expert")


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


def hard_instances(families: Sequence[str], n_per_family: int) -> list[Task]:
    """n distinct held-out tasks (seeds from EVAL_SEED_BASE) of the harder instances of each trained
    family (`HARD_INSTANCES`); a family without them is refused with the ones that have them."""
    missing = [f for f in families if f not in HARD_INSTANCES]
    if missing:
        raise ValueError(f"no hard instances of {missing}: defined for {sorted(HARD_INSTANCES)}")
    out, seen = [], set()
    for task in heldout_tasks([HARD_INSTANCES[f] for f in families], 2 * n_per_family):
        if (task.family, task.instruction) not in seen and sum(t.family == task.family for t in out) < n_per_family:
            seen.add((task.family, task.instruction))
            out.append(task)
    if len(out) < n_per_family * len(families):
        raise ValueError(f"fewer than {n_per_family} distinct hard instances of {families} in {2 * n_per_family} seeds")
    return out


def mean_pass_at_k(successes: Sequence[int], n: int, k: int) -> float:
    """pass@k over tasks: the mean of `pass_at_k(n, c_t, k)` over each task's successes c_t."""
    if not successes:
        raise ValueError("mean_pass_at_k needs at least one task's successes")
    return sum(pass_at_k(n, c, k) for c in successes) / len(successes)


def select_families(rates: dict[str, tuple[int, int]], rates_at_k: dict[str, float],
                    band: tuple[float, float] = PASS1_BAND,
                    at_k_min: float = PASS_AT_K_MIN) -> tuple[list[str], bool]:
    """The families with pass@1 (successes / episodes in `rates`) in the band and pass@k
    (`rates_at_k`) ≥ `at_k_min`, and True; else the one nearest to that (pass@1 > 0 first) and False."""
    lo, hi = band
    p = {f: s / n for f, (s, n) in rates.items() if n}
    missing = sorted(set(p) - set(rates_at_k))
    if missing:
        raise ValueError(f"no pass@k for {missing}: give rates_at_k for every family of rates")
    inside = [f for f in rates if f in p and lo <= p[f] <= hi and rates_at_k[f] >= at_k_min]
    if inside:
        return inside, True
    if not p:
        return [], False

    def distance(f: str) -> float:
        return max(lo - p[f], p[f] - hi, 0.0) + max(at_k_min - rates_at_k[f], 0.0)

    nearest = min(p, key=lambda f: (p[f] == 0.0, distance(f)))
    return [nearest], False


def baseline_success(tasks: Sequence[Task], harnesses: Sequence[str], policy: str, seed: int = 0,
                     workers: int = 4) -> list[int]:
    """1 or 0 per task: one episode of `policy` ("random": envs' random policy, "expert": the
    scripted expert) on tasks[i] in harnesses[i], scored by the task's verifier (reward 1).
    `workers` episodes at once: a coding episode mostly waits on its jailed commands and tests."""
    if policy not in BASELINES:
        raise ValueError(f"unknown baseline policy {policy!r}: choose from {BASELINES}")
    if len(harnesses) != len(tasks):
        raise ValueError(f"give one harness per task: {len(tasks)} tasks, {len(harnesses)} harnesses")

    def play(i: int) -> int:
        # A scripted policy keeps its episode's state: one per episode, as episodes run side by side.
        player = expert_policy(None, harnesses[i]) if policy == "expert" else random_policy(harnesses[i], seed)
        with envs.make_env(tasks[i].family, harness=harnesses[i]) as env:
            return int(envs.rollout(env, player, task=tasks[i])["reward"] >= 1.0)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(play, range(len(tasks))))


@dataclass(frozen=True)
class LadderConfig:
    tasks_per_family: int = 4
    samples: int = 8  # G: the group size the pass rates are measured at
    temperature: float = 1.0
    band: tuple[float, float] = PASS1_BAND  # pass@1 band
    k: int = PASS_K
    pass_at_k_min: float = PASS_AT_K_MIN
    seed: int = 0
    domains: tuple[str, ...] = DOMAINS
    efforts: tuple[str, ...] = EFFORTS
    families: tuple[str, ...] = SFT_FAMILIES
    # The splits of a cell (`LadderReport.splits`): RL prompts and held-out tasks per selected
    # family, tasks of the domain's hard split.
    rl_tasks_per_family: int = 16
    heldout_tasks_per_family: int = 16
    hard_tasks: int = 16
    # Tasks per family of each split the random and expert policies play (0: none).
    baseline_tasks_per_family: int = 16

    def __post_init__(self) -> None:
        if self.tasks_per_family < 1 or self.samples < 2:
            raise ValueError(f"need tasks_per_family ≥ 1 and samples ≥ 2 (pass rates of groups), got "
                             f"{self.tasks_per_family}, {self.samples}")
        if not 1 <= self.k <= self.samples:
            raise ValueError(f"pass@k needs 1 ≤ k ≤ samples, got k = {self.k}, samples = {self.samples}: "
                             "raise samples or lower k")
        lo, hi = self.band
        if not 0 <= lo < hi <= 1 or not 0 <= self.pass_at_k_min <= 1:
            raise ValueError(f"band must satisfy 0 ≤ lo < hi ≤ 1 and pass_at_k_min lie in [0, 1], got "
                             f"{self.band}, {self.pass_at_k_min}")
        if min(self.rl_tasks_per_family, self.heldout_tasks_per_family, self.hard_tasks) < 1:
            raise ValueError(f"every split needs ≥ 1 task per family, got rl {self.rl_tasks_per_family}, "
                             f"heldout {self.heldout_tasks_per_family}, hard {self.hard_tasks}")
        if self.baseline_tasks_per_family < 0:
            raise ValueError(f"baseline_tasks_per_family must be ≥ 0 (0: no baselines), got "
                             f"{self.baseline_tasks_per_family}")
        for d in self.domains:
            check_domain(d)
        for e in self.efforts:
            if e not in EFFORTS:
                raise ValueError(f"unknown effort {e!r}: choose from {EFFORTS}")


@dataclass
class LadderCell:
    domain: str
    effort: str
    families: dict[str, tuple[int, int]]  # family → (successes, episodes) at T = 1: pass@1
    selected: list[str]
    in_band: bool
    informative_frac: float  # tasks with 0 < successes < samples, over the selected families
    tokens: float  # mean policy tokens per episode at this effort (all the domain's families)
    pass_at_k: dict[str, float] = field(default_factory=dict)  # family → pass@k
    greedy: dict[str, tuple[int, int]] = field(default_factory=dict)  # family → (successes, tasks) at T = 0
    # split ("rl", "heldout", "hard") → policy ("random", "expert") → (successes, episodes)
    baselines: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)

    @property
    def pass_rate(self) -> float:
        """pass@1 over the selected families."""
        s = sum(self.families[f][0] for f in self.selected)
        n = sum(self.families[f][1] for f in self.selected)
        return s / n if n else 0.0

    @property
    def pass_at_k_rate(self) -> float:
        """pass@k over the selected families' tasks (weighted by their episodes: equal at one G)."""
        fams = [f for f in self.selected if f in self.pass_at_k]
        n = sum(self.families[f][1] for f in fams)
        return sum(self.pass_at_k[f] * self.families[f][1] for f in fams) / n if n else 0.0

    @property
    def greedy_rate(self) -> float:
        s = sum(self.greedy[f][0] for f in self.selected if f in self.greedy)
        n = sum(self.greedy[f][1] for f in self.selected if f in self.greedy)
        return s / n if n else 0.0


@dataclass
class LadderReport:
    config: LadderConfig
    cells: list[LadderCell] = field(default_factory=list)
    seconds: float = 0.0

    def cell(self, domain: str, effort: str) -> LadderCell:
        check_route(domain, effort)
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

    def splits(self, domain: str, effort: str) -> dict[str, list[Task]]:
        """The cell's three task splits at the config's sizes: "rl" (its RL prompts), "heldout"
        (specialist vs sft_policy) and "hard" (the domain's hard split)."""
        cfg = self.config
        rl = self.rl_tasks(domain, effort, cfg.rl_tasks_per_family)
        held = heldout_tasks(self.cell(domain, effort).selected, cfg.heldout_tasks_per_family, exclude=rl)
        return dict(zip(SPLITS, (rl, held, hard_tasks(domain, cfg.hard_tasks))))

    def measure_baselines(self) -> None:
        """Each cell's `baselines`: the random and expert policies on the first
        `baseline_tasks_per_family` tasks of each family of each split, in the harness the split's
        evaluation gives each task. A (task, harness, policy) plays once for all cells."""
        m = self.config.baseline_tasks_per_family
        if m == 0:
            return
        played: dict[tuple[str, str, str], int] = {}
        for c in self.cells:
            c.baselines = {}
            for split, tasks in self.splits(c.domain, c.effort).items():
                harnesses = resolve_harnesses(len(tasks), None)
                kept, taken = [], {}
                for task, h in zip(tasks, harnesses):
                    if taken.get(task.family, 0) < m:
                        taken[task.family] = taken.get(task.family, 0) + 1
                        kept.append((task, h))
                c.baselines[split] = {}
                for policy in BASELINES:
                    todo = [(t, h) for t, h in kept if (policy, t.id, h) not in played]
                    if todo:
                        wins = baseline_success([t for t, _ in todo], [h for _, h in todo], policy, self.config.seed)
                        played.update({(policy, t.id, h): w for (t, h), w in zip(todo, wins)})
                    c.baselines[split][policy] = (sum(played[(policy, t.id, h)] for t, h in kept), len(kept))

    def random_passes(self) -> list[str]:
        """"domain/effort/split" of every split a random policy passed at least once (should be none)."""
        return [f"{c.domain}/{c.effort}/{s}" for c in self.cells for s, b in c.baselines.items()
                if b.get("random", (0, 0))[0] > 0]

    def table(self) -> str:
        """Markdown: one row per (domain, effort, family): pass@1, pass@k, greedy, and the selection."""
        k = self.config.k
        rows = [f"| domain | effort | family | pass@1 (T=1) | pass@{k} | greedy | selected | cell in band |",
                "|---|---|---|---:|---:|---:|---|---|"]
        for c in self.cells:
            for f, (s, n) in c.families.items():
                pk = f"{c.pass_at_k[f]:.2f}" if f in c.pass_at_k else ""
                g = f"{c.greedy[f][0] / c.greedy[f][1]:.2f}" if c.greedy.get(f, (0, 0))[1] else ""
                rows.append(f"| {c.domain} | {c.effort} | {f} | {s / n:.2f} | {pk} | {g} | "
                            f"{'yes' if f in c.selected else ''} | {'yes' if c.in_band else 'NO'} |")
        return "\n".join(rows)

    def baseline_table(self) -> str:
        """Markdown: per (domain, effort, split), the random and the expert policy's success."""
        rows = ["| domain | effort | split | tasks | random | expert |", "|---|---|---|---:|---:|---:|"]
        for c in self.cells:
            for split, b in c.baselines.items():
                (rs, rn), (es, en) = b["random"], b["expert"]
                if rn:
                    rows.append(f"| {c.domain} | {c.effort} | {split} | {rn} | {rs / rn:.2f} | {es / en:.2f} |")
        return "\n".join(rows)

    def as_metadata(self) -> dict[str, float | str]:
        cfg = self.config
        out: dict[str, float | str] = {"seconds": self.seconds, "samples": cfg.samples,
                                       "tasks_per_family": cfg.tasks_per_family, "k": cfg.k,
                                       "band": f"{cfg.band[0]}–{cfg.band[1]}", "pass_at_k_min": cfg.pass_at_k_min}
        for c in self.cells:
            key = f"{c.domain}/{c.effort}"
            out[f"{key}/pass_rate"] = c.pass_rate
            out[f"{key}/pass_at_k"] = c.pass_at_k_rate
            out[f"{key}/greedy"] = c.greedy_rate
            out[f"{key}/selected"] = ",".join(c.selected)
            out[f"{key}/in_band"] = float(c.in_band)
            out[f"{key}/informative_frac"] = c.informative_frac
            out[f"{key}/tokens"] = c.tokens
            for f, (s, n) in c.families.items():
                out[f"{key}/family/{f}"] = s / n
                if f in c.pass_at_k:
                    out[f"{key}/family/{f}/pass_at_k"] = c.pass_at_k[f]
                if c.greedy.get(f, (0, 0))[1]:
                    out[f"{key}/family/{f}/greedy"] = c.greedy[f][0] / c.greedy[f][1]
            for split, b in c.baselines.items():
                for policy, (s, n) in b.items():
                    out[f"{key}/{split}/{policy}"] = s / n if n else 0.0
                out[f"{key}/{split}/baseline_tasks"] = b["random"][1]
        return out

    def to_json(self) -> dict:
        return {"config": asdict(self.config), "seconds": self.seconds,
                "cells": [{**asdict(c), "pass_rate": c.pass_rate, "pass_at_k_rate": c.pass_at_k_rate,
                           "greedy_rate": c.greedy_rate} for c in self.cells]}

    @classmethod
    def from_json(cls, d: dict) -> LadderReport:
        """The report `to_json` wrote (the rl_tasks asset's output, read by each specialist). A
        ladder written before pass@k, greedy and the baselines were measured reads with them empty."""
        c = dict(d["config"])
        c.setdefault("k", min(PASS_K, c["samples"]))
        cfg = LadderConfig(**{**c, "band": tuple(c["band"]), "domains": tuple(c["domains"]),
                              "efforts": tuple(c["efforts"]), "families": tuple(c["families"])})
        cells = [LadderCell(x["domain"], x["effort"], {f: tuple(v) for f, v in x["families"].items()},
                            list(x["selected"]), x["in_band"], x["informative_frac"], x["tokens"],
                            dict(x.get("pass_at_k", {})), {f: tuple(v) for f, v in x.get("greedy", {}).items()},
                            {s: {p: tuple(v) for p, v in b.items()} for s, b in x.get("baselines", {}).items()})
                 for x in d["cells"]]
        return cls(cfg, cells, d.get("seconds", 0.0))


def measure_ladder(model, tokenizer, cfg: LadderConfig = LadderConfig(), harness=None, specs=None) -> LadderReport:
    """pass@1, pass@k and greedy success of `model` (the SFT policy) per family and effort, the
    selection per cell, and the random and expert policies on each cell's splits. Two `evaluate`
    calls per effort over every candidate family (G samples at T = 1, one greedy); `harness` and
    `specs` (the per-effort budgets) are evaluate's."""
    t0 = time.perf_counter()
    report = LadderReport(cfg)
    for effort in cfg.efforts:
        families = [f for d in cfg.domains for f in domain_families(d, cfg.families)]
        tasks = tasks_of(families, cfg.tasks_per_family, RL_SEED_BASE)
        r = evaluate(model, tokenizer, tasks, effort, samples=cfg.samples, temperature=cfg.temperature,
                     harness=harness, seed=cfg.seed, specs=specs)
        g = evaluate(model, tokenizer, tasks, effort, samples=1, temperature=0.0, harness=harness,
                     seed=cfg.seed, specs=specs)
        for domain in cfg.domains:
            rates = {f: r.per_family[f] for f in domain_families(domain, cfg.families) if f in r.per_family}
            at_k = {f: mean_pass_at_k([r.per_task[t.id] for t in tasks if t.family == f], cfg.samples, cfg.k)
                    for f in rates}
            selected, in_band = select_families(rates, at_k, cfg.band, cfg.pass_at_k_min)
            chosen = [t.id for t in tasks if t.family in selected]
            informative = sum(0 < r.per_task[i] < cfg.samples for i in chosen) / max(len(chosen), 1)
            report.cells.append(LadderCell(domain, effort, rates, selected, in_band, informative,
                                           r.mean_policy_tokens, at_k, {f: g.per_family[f] for f in rates}))
    report.measure_baselines()
    report.seconds = time.perf_counter() - t0
    return report
