"""Multi-teacher on-policy distillation (MOPD): one student for every domain and effort (DESIGN.md §1,
§4, §5 claim 4; research/recipe.md §6, research/posttrain-anchors.md §2).

One call trains the student:  setup → model → teachers → optimizer → data → loop (checkpoint, step, log).

1. The student (initialised from sft_policy) samples its own episodes, multi-turn through `envs`
   (`k3model.train.rollout.TokenPolicy`), on tasks of every domain at every effort; the effort
   control token is in the prompt the student sees.
2. Each episode is routed by its (domain, effort) to that specialist teacher T_{d,e}, which scores
   the episode's token ids — the very ids the student sampled, never re-rendered or re-tokenized: the
   teacher gets the student's id tensor, and `check_same_ids` asserts it (a renderer mismatch biased
   teacher log-probabilities by +0.29 nats/token in a public recipe: tinker #796).
3. Per generated token t (never prompts or tool results), the stop-gradient advantage is the
   negative single-sample reverse KL (tinker's `kl_discount_factor = 0`):
       A_t = log π_T(y_t | y_<t) − log π_S(y_t | y_<t)
   optionally plus α × the episode's outcome advantage (r_i − mean of its prompt group's rewards;
   α = `outcome_coef`, 0 by default), and trained with the importance-sampling policy gradient
   (tinker's `importance_sampling` loss) with the weight truncated at C (`is_cap`):
       L = −Σ_t min(π_θ(y_t) / π_rollout(y_t), C) · A_t  /  N_tokens
   where π_rollout is the engine's recorded (untempered) log-probability: the ratio corrects the
   rollout/training mismatch and is 1 in value on-policy, so ∇L = −Σ A_t ∇log π_θ(y_t) / N.
4. Because the vocabulary is small, the exact per-position reverse KL
       KL_t = Σ_v π_S(v) (log π_S(v) − log π_T(v))
   is computed beside the sampled estimators k1_t = −A_t and k3_t = (ρ − 1) − log ρ with
   ρ = π_T(y_t)/π_S(y_t) (Schulman's k3), and their bias mean(k − KL) and variance var(k − KL)
   against it are logged: the sampled advantage is unbiased only for tokens drawn from π_S itself
   (temperature 1, no top-k), and noisy (PowerOPD: unbounded log-ratio early tokens).

Bad input gets a ValueError: a (domain, effort) with no teacher (named as its partition key
`domain|effort`), a teacher whose vocabulary or recorded tokenizer differs from the student's, an
effort the student's SFT data never showed it.

No Dagster, Ray or MLflow here: the caller passes `log_fn(step, metrics)`. FLOPs are counted on
every forward and backward (`k3model.train.flops.counting`: rollout, teacher and training passes),
for the equal-compute control.
Legend: B rows (episodes), T tokens of the padded batch, N generated (scored) tokens, V vocabulary.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

import envs
from datagen.tokenizer import EFFORT_TOKENS, special_token_ids
from k3model.checkpoint import load_model
from k3model.engine import SamplingConfig
from k3model.model import K3Model
from k3model.train.common import (Loop, LoopConfig, autocast_for, build_optimizer, optimizer_step, restore_train_state,
                                  save_state, set_lr)
from k3model.train.evaluate import EvalReport, evaluate_together
from k3model.train.flops import FlopCounter, counting
from k3model.train.effort import DOMAINS, EFFORT_SPECS, EFFORTS, EffortSpec, Route, partition_key, training_harnesses
from k3model.train.rollout import Episode, TokenPolicy, play_tasks, sft_format

logger = logging.getLogger(__name__)

LogFn = Callable[[int, dict], None]

@dataclass(frozen=True)
class MOPDConfig(LoopConfig):
    """LoopConfig with MOPD's defaults (20 steps at a constant 5e-5, no decay) and its own fields."""
    steps: int = 20
    lr: float = 5e-5
    warmup_frac: float = 0.0
    min_lr_ratio: float = 1.0
    weight_decay: float = 0.0
    log_every: int = 5
    episodes_per_step: int = 9  # spread round-robin over the routes
    samples_per_task: int = 1  # episodes per task (≥ 2 for a group-relative outcome advantage)
    temperature: float = 1.0  # 1: the sampled advantage is an unbiased reverse-KL estimate
    # Per-effort turn and episode budgets; None: the specialists' (effort.EFFORT_SPECS), so the
    # student is distilled under the budgets its teachers were trained with.
    specs: dict[str, EffortSpec] | None = None
    is_cap: float = 2.0
    outcome_coef: float = 0.0  # α on the outcome advantage; 0: pure distillation
    domains: tuple[str, ...] = DOMAINS
    efforts: tuple[str, ...] = EFFORTS
    harnesses: tuple[str, ...] | None = None  # None: datagen.sft's training harnesses
    difficulties: tuple[str, ...] = ("easy",)
    task_seed: int = 0  # tasks of route r are envs.task_set(domain, …, seed=task_seed)
    tasks_per_route: int = 16
    qat: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("steps", "episodes_per_step", "samples_per_task", "tasks_per_route")
        if self.is_cap < 1:
            raise ValueError(f"is_cap must be ≥ 1 (below 1 every on-policy token would be capped), got {self.is_cap}")
        if self.outcome_coef < 0:
            raise ValueError(f"outcome_coef must be ≥ 0, got {self.outcome_coef}")
        if self.outcome_coef > 0 and self.samples_per_task < 2:
            raise ValueError("outcome_coef > 0 needs samples_per_task ≥ 2 (the outcome advantage is relative "
                             "to the other episodes of the same task)")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the student samples its own answers), got {self.temperature}")
        for d in self.domains:
            if d not in DOMAINS:
                raise ValueError(f"unknown domain {d!r}: choose from {DOMAINS}")
        for e in self.efforts:
            if e not in EFFORTS:
                raise ValueError(f"unknown effort {e!r}: choose from {EFFORTS}")
            if self.specs is not None and e not in self.specs:
                raise ValueError(f"specs has no entry for effort {e!r}")
        if not self.domains or not self.efforts:
            raise ValueError("domains and efforts must each name at least one")
        for h in self.harnesses or ():
            if h not in envs.HARNESSES:
                raise ValueError(f"unknown harness {h!r}: choose from {envs.HARNESSES}")

    @property
    def routes(self) -> list[Route]:
        return [(d, e) for d in self.domains for e in self.efforts]

    def spec(self, effort: str) -> EffortSpec:
        return (self.specs or EFFORT_SPECS)[effort]


@dataclass
class MOPDResult:
    checkpoint_dir: Path
    history: list[dict] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    teacher_manifest: dict[str, dict] = field(default_factory=dict)  # partition key → checkpoint, sha256
    flops: dict[str, float] = field(default_factory=dict)
    resumed_from_step: int | None = None


# ----------------------------------------------------------------------------------------------
# The pure parts: advantages, the loss, the exact KL and the estimators' error

def distill_advantages(logp_teacher_N: torch.Tensor, logp_student_N: torch.Tensor) -> torch.Tensor:
    """A_t = log π_T(y_t) − log π_S(y_t), detached (the negative single-sample reverse KL)."""
    return (logp_teacher_N - logp_student_N).detach().float()


def outcome_advantages(rewards: Sequence[float], groups: Sequence[int]) -> torch.Tensor:
    """r_i − mean of the rewards of episode i's group (the episodes of one task), one per episode."""
    r = torch.tensor(list(rewards), dtype=torch.float32)
    g = torch.tensor(list(groups))
    out = torch.empty_like(r)
    for k in g.unique():
        sel = g == k
        out[sel] = r[sel] - r[sel].mean()
    return out


def mopd_loss(logp_N: torch.Tensor, logp_rollout_N: torch.Tensor, adv_N: torch.Tensor, is_cap: float = 2.0,
              denominator: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L = −Σ_t min(exp(logp_t − logp_rollout_t), C) · A_t / denominator (default: N tokens).

    logp_N: log π_θ of the sampled tokens (with grad); logp_rollout_N: the sampler's; adv_N: per-token
    advantages (detached). Where the weight is capped it carries no gradient (truncated IS: the token
    is too far off the rollout policy to trust). Returns the loss and detached stats (tensors)."""
    if logp_N.numel() == 0:
        raise ValueError("no generated tokens to train on")
    denom = float(logp_N.numel()) if denominator is None else float(denominator)
    ratio_N = torch.exp(logp_N - logp_rollout_N.detach())
    w_N = ratio_N.clamp(max=is_cap)
    loss = -(w_N * adv_N.detach()).sum() / denom
    with torch.no_grad():
        stats = {"mopd/is_capped_frac": (ratio_N > is_cap).float().mean(),
                 "mopd/is_weight_mean": w_N.mean(), "mopd/adv_mean": adv_N.mean(), "mopd/tokens": torch.tensor(
                     float(logp_N.numel()))}
    return loss, stats


def reverse_kl_exact(logits_student_NV: torch.Tensor, logits_teacher_NV: torch.Tensor) -> torch.Tensor:
    """KL(π_S ‖ π_T) at each position over the full vocabulary, in fp32 (no gradient)."""
    with torch.no_grad():
        ls = logits_student_NV.float().log_softmax(-1)
        lt = logits_teacher_NV.float().log_softmax(-1)
        return (ls.exp() * (ls - lt)).sum(-1)


def estimator_error(logp_student_N: torch.Tensor, logp_teacher_N: torch.Tensor,
                    kl_exact_N: torch.Tensor) -> dict[str, torch.Tensor]:
    """Bias mean(k − KL) and variance var(k − KL) of the sampled reverse-KL estimators against the
    exact per-position KL: k1 = log π_S(y) − log π_T(y), k3 = (ρ − 1) − log ρ, ρ = π_T(y) / π_S(y)."""
    with torch.no_grad():
        log_rho = (logp_teacher_N - logp_student_N).float()
        k1 = -log_rho
        k3 = torch.expm1(log_rho) - log_rho
        out = {"kl/exact": kl_exact_N.mean(), "kl/k1": k1.mean(), "kl/k3": k3.mean()}
        for name, k in (("k1", k1), ("k3", k3)):
            err = k - kl_exact_N
            out[f"kl/{name}_bias"] = err.mean()
            out[f"kl/{name}_var"] = err.var(unbiased=False)
        return out


# ----------------------------------------------------------------------------------------------
# Routing and its checks

def tokenizer_sha256(tokenizer) -> str:
    """A fingerprint of a `tokenizers.Tokenizer`: sha256 of its serialised vocabulary and merges."""
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def recorded_tokenizer(manifest: dict) -> str | None:
    """The tokenizer fingerprint a checkpoint's manifest records: `data_versions.tokenizer_sha256`
    (this module's), or `tokenizer_path` (pretraining's sha256 of the tokenizer file, which is
    `Tokenizer.to_str()`, so the two agree)."""
    versions = manifest.get("data_versions") or {}
    return versions.get("tokenizer_sha256") or versions.get("tokenizer_path")


def trained_efforts(manifest: dict) -> tuple[str, ...] | None:
    """The efforts an SFT checkpoint's demonstrations held (its manifest's data config), None if unknown."""
    data = (manifest.get("config") or {}).get("data") or {}
    efforts = (data.get("config") or {}).get("efforts")
    return tuple(efforts) if efforts is not None else None


def check_routes(routes: Sequence[Route], teachers: Mapping[Route, object]) -> None:
    """Every route has a teacher; name the missing partitions."""
    for key in teachers:
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] in DOMAINS and key[1] in EFFORTS):
            raise ValueError(f"teacher key {key!r} is not a (domain, effort) pair with domain in {DOMAINS} and "
                             f"effort in {EFFORTS}")
    missing = [partition_key(r) for r in routes if r not in teachers]
    if missing:
        raise ValueError(f"no teacher for rl_specialist partition(s) {', '.join(missing)}: materialize them "
                         "or drop those domains/efforts from MOPDConfig")


def check_compatible(student_manifest: dict, student_vocab: int, tokenizer, teacher_manifests: Mapping[str, dict],
                     teacher_vocabs: Mapping[str, int], efforts: Sequence[str]) -> None:
    """The student and every teacher share the tokenizer and vocabulary; the student was trained on
    every effort asked for."""
    fingerprint = tokenizer_sha256(tokenizer)
    n_tok = tokenizer.get_vocab_size()
    if n_tok > student_vocab:
        raise ValueError(f"the tokenizer has {n_tok} ids but the student's vocabulary only {student_vocab}: "
                         "pass the tokenizer the student was trained with")
    rec = recorded_tokenizer(student_manifest)
    if rec is not None and rec != fingerprint:
        raise ValueError(f"the student was trained with tokenizer {rec[:12]}…, not the one given ({fingerprint[:12]}…)")
    for name, manifest in teacher_manifests.items():
        if teacher_vocabs[name] != student_vocab:
            raise ValueError(f"teacher {name} has a vocabulary of {teacher_vocabs[name]} ids, the student "
                             f"{student_vocab}: MOPD scores the student's token ids with the teacher, so both "
                             "must be trained from one tokenizer")
        rec = recorded_tokenizer(manifest)
        if rec is not None and rec != fingerprint:
            raise ValueError(f"teacher {name} was trained with tokenizer {rec[:12]}…, the student with "
                             f"{fingerprint[:12]}…: the same ids would mean other text to it")
    known = trained_efforts(student_manifest)
    if known is not None:
        unknown = [e for e in efforts if e not in known]
        if unknown:
            raise ValueError(f"the student was never trained on effort(s) {unknown} (its SFT data held "
                             f"{list(known)}): drop them from MOPDConfig.efforts or retrain SFT with them")


def check_same_ids(teacher_ids_BT: torch.Tensor, episodes: Sequence[Episode], effort_ids: Mapping[str, int],
                   efforts: Sequence[str], pad_id: int = 0) -> None:
    """The hard assert of research/posttrain-anchors.md §2.4: the teacher is fed exactly the ids the
    student sampled (row for row, every position, padding only after the episode's end), and each
    row's effort control token is the one its route names."""
    assert teacher_ids_BT.shape[0] == len(episodes), "one teacher row per episode"
    for b, (ep, effort) in enumerate(zip(episodes, efforts)):
        n = len(ep.token_ids)
        row = teacher_ids_BT[b].tolist()
        assert row[:n] == ep.token_ids, f"row {b}: the teacher would score other token ids than the student sampled"
        assert all(i == pad_id for i in row[n:]), f"row {b}: the teacher's row runs past the episode"
        control = [i for i in ep.token_ids[:4] if i in effort_ids.values()]
        assert control == [effort_ids[effort]], \
            f"row {b}: routed to effort {effort} but its prompt's effort token is {control}"


# ----------------------------------------------------------------------------------------------
# Forward passes on the episodes' ids

def pad_rows(rows: Sequence[Sequence[int]], pad_id: int = 0) -> torch.Tensor:
    T = max(len(r) for r in rows)
    ids_BT = torch.full((len(rows), T), pad_id, dtype=torch.long)
    for b, r in enumerate(rows):
        ids_BT[b, : len(r)] = torch.tensor(list(r))
    return ids_BT


def generated_positions(episodes: Sequence[Episode]) -> tuple[torch.Tensor, torch.Tensor]:
    """(row_N, pos_N) of every model-sampled token; its logits sit at pos − 1."""
    rows, pos = [], []
    for b, ep in enumerate(episodes):
        for t, g in enumerate(ep.generated):
            if g:
                rows.append(b)
                pos.append(t)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(pos, dtype=torch.long)


def position_logits(model: K3Model, ids_BT: torch.Tensor, row_N: torch.Tensor, pos_N: torch.Tensor) -> torch.Tensor:
    """The output head only where it is needed: the logits predicting each selected token [N, V]."""
    hidden_BTD = model(ids_BT, logits=False).hidden_BTD
    h_ND = hidden_BTD[row_N, pos_N - 1]
    return model.lm_head(model.final_norm(h_ND))


# ----------------------------------------------------------------------------------------------
# Loading

def load_teachers(teachers: Mapping[Route, str | Path], qat: bool, device: str) -> tuple[dict[Route, K3Model], dict[str, dict]]:
    """One model per distinct checkpoint (two routes may share one), eval mode, no grad."""
    by_path: dict[str, tuple[K3Model, dict]] = {}
    models, manifests = {}, {}
    for route, ckpt in teachers.items():
        key = str(Path(ckpt).resolve())
        if key not in by_path:
            model, manifest = load_model(ckpt, qat="auto" if qat else False, frozen_router=True)
            model.to(device).eval().requires_grad_(False)
            by_path[key] = (model, manifest)
        models[route] = by_path[key][0]
        manifests[partition_key(route)] = by_path[key][1]
    return models, manifests


# ----------------------------------------------------------------------------------------------
# The loop

def route_tasks(cfg: MOPDConfig, tasks: Mapping[Route, Sequence] | None) -> dict[Route, list]:
    """The prompt pool of each route: given, or `envs.task_set(domain, tasks_per_route, task_seed)`."""
    if tasks is not None:
        missing = [partition_key(r) for r in cfg.routes if not tasks.get(r)]
        if missing:
            raise ValueError(f"tasks gives no task for route(s) {', '.join(missing)}")
        return {r: list(tasks[r]) for r in cfg.routes}
    by_domain = {d: envs.task_set(d, cfg.tasks_per_route, seed=cfg.task_seed, difficulties=cfg.difficulties)
                 for d in cfg.domains}
    return {(d, e): by_domain[d] for d, e in cfg.routes}


@dataclass(frozen=True)
class Prompt:
    route: Route
    task: object  # an envs Task
    harness: str


def step_prompts(cfg: MOPDConfig, step: int, pools: Mapping[Route, Sequence], harnesses: Sequence[str]) -> list[Prompt]:
    """Step `step`'s prompts (each played `samples_per_task` times): routes round-robin, each
    route's pool in order, harnesses round-robin."""
    routes = cfg.routes
    n = -(-cfg.episodes_per_step // cfg.samples_per_task)
    out = []
    for j in range(n):
        k = step * n + j
        route = routes[k % len(routes)]
        pool = pools[route]
        out.append(Prompt(route, pool[(k // len(routes)) % len(pool)], harnesses[k % len(harnesses)]))
    return out


def rollout(model: K3Model, tokenizer, prompts: Sequence[Prompt], cfg: MOPDConfig,
            generator: torch.Generator) -> tuple[list[Episode], list[Route], list[int]]:
    """The student plays each prompt `samples_per_task` times, one batch per effort (the effort
    token is part of the format: `rollout.sft_format`, the renderer SFT and RL use) with that
    effort's turn and episode budgets. Returns the episodes in prompt order, their routes and their
    groups (the index of their prompt)."""
    played: list[list[Episode]] = [[] for _ in prompts]
    for effort in dict.fromkeys(p.route[1] for p in prompts):
        idx = [i for i, p in enumerate(prompts) if p.route[1] == effort]
        spec = cfg.spec(effort)
        for j, _harness, ep in play_tasks(model, sft_format(tokenizer, effort), [prompts[i].task for i in idx],
                                          [prompts[i].harness for i in idx],
                                          SamplingConfig(spec.turn_tokens, temperature=cfg.temperature),
                                          samples=cfg.samples_per_task, episode_budget=spec.budget_tokens,
                                          generator=generator):
            played[idx[j]].append(ep)
    episodes = [ep for eps in played for ep in eps]
    routes = [p.route for p, eps in zip(prompts, played) for _ in eps]
    groups = [i for i, eps in enumerate(played) for _ in eps]
    return episodes, routes, groups


def distill_step(student: K3Model, teachers: Mapping[Route, K3Model], episodes: Sequence[Episode],
                 routes: Sequence[Route], groups: Sequence[int], cfg: MOPDConfig, effort_ids: Mapping[str, int],
                 device: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one batch and its statistics: teacher scores on the student's ids, advantages,
    the IS loss, the exact KL and the estimators' error, per route too."""
    ids_BT = pad_rows([ep.token_ids for ep in episodes]).to(device)
    row_N, pos_N = generated_positions(episodes)
    if row_N.numel() == 0:
        raise ValueError("the batch's episodes hold no generated token")
    row_N, pos_N = row_N.to(device), pos_N.to(device)
    targets_N = ids_BT[row_N, pos_N]
    logp_rollout_N = torch.tensor([ep.model_logprobs[t] for ep in episodes for t, g in enumerate(ep.generated) if g],
                                  device=device)

    # The teacher of each route scores that route's rows, from the same id tensor.
    logits_T_NV = torch.empty(row_N.numel(), student.cfg.vocab_size, device=device)
    route_of_row = list(routes)
    for route in dict.fromkeys(route_of_row):
        rows_r = [b for b, r in enumerate(route_of_row) if r == route]
        sel_N = torch.isin(row_N, torch.tensor(rows_r, device=device))
        teacher_ids_BT = ids_BT[rows_r]
        check_same_ids(teacher_ids_BT, [episodes[b] for b in rows_r], effort_ids, [route[1]] * len(rows_r))
        remap = {b: i for i, b in enumerate(rows_r)}
        local_rows = torch.tensor([remap[int(b)] for b in row_N[sel_N]], device=device)
        with torch.no_grad(), autocast_for(device):
            logits_T_NV[sel_N] = position_logits(teachers[route], teacher_ids_BT, local_rows, pos_N[sel_N]).float()

    student.train()
    with autocast_for(device):
        logits_S_NV = position_logits(student, ids_BT, row_N, pos_N).float()
    logp_S_all = logits_S_NV.log_softmax(-1)
    logp_N = logp_S_all.gather(-1, targets_N.unsqueeze(-1)).squeeze(-1)
    logp_T_N = logits_T_NV.log_softmax(-1).gather(-1, targets_N.unsqueeze(-1)).squeeze(-1)
    adv_N = distill_advantages(logp_T_N, logp_N)
    if cfg.outcome_coef > 0:
        outcome_B = outcome_advantages([ep.reward for ep in episodes], groups).to(device)
        adv_N = adv_N + cfg.outcome_coef * outcome_B[row_N]
    loss, stats = mopd_loss(logp_N, logp_rollout_N, adv_N, cfg.is_cap)
    kl_N = reverse_kl_exact(logits_S_NV, logits_T_NV)
    stats.update(estimator_error(logp_N.detach(), logp_T_N, kl_N))
    with torch.no_grad():
        for route in dict.fromkeys(route_of_row):
            sel_N = torch.isin(row_N, torch.tensor([b for b, r in enumerate(route_of_row) if r == route], device=device))
            stats[f"kl/{route[0]}/{route[1]}"] = kl_N[sel_N].mean()
        stats["mopd/logp_diff_abs_mean"] = (logp_N.detach() - logp_rollout_N).abs().mean()
    return loss, stats


def train(cfg: MOPDConfig, student_checkpoint: str | Path, teachers: Mapping[Route, str | Path], tokenizer,
          out_dir: str | Path, *, tasks: Mapping[Route, Sequence] | None = None, log_fn: LogFn | None = None,
          stop_after: int | None = None) -> MOPDResult:
    """Distil the nine (or cfg's) teachers into one student initialised from `student_checkpoint`.

    `teachers` maps (domain, effort) to a checkpoint directory; `tasks` optionally gives each route's
    prompt pool (envs Tasks), else `route_tasks` draws them. `stop_after` ends early (to test resume)."""
    # ---- setup
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loop = Loop(cfg, out_dir, log_fn, stop_after=stop_after)
    check_routes(cfg.routes, teachers)
    specials = special_token_ids(tokenizer)
    effort_ids = {e: specials[EFFORT_TOKENS[e]] for e in EFFORTS}
    harnesses = tuple(cfg.harnesses or training_harnesses())

    # ---- model
    student, student_manifest = load_model(student_checkpoint, qat="auto" if cfg.qat else False,
                                           frozen_router=True)
    used = {r: teachers[r] for r in cfg.routes}
    teacher_models, teacher_manifests = load_teachers(used, cfg.qat, device)
    check_compatible(student_manifest, student.cfg.vocab_size, tokenizer, teacher_manifests,
                     {k: teacher_models[r].cfg.vocab_size for r in used for k in [partition_key(r)]}, cfg.efforts)
    run = loop.resume(student)
    student.to(device)

    # ---- optimizer
    optimizer = build_optimizer(student, cfg.lr, cfg.weight_decay)
    if run.state is not None:
        restore_train_state(run.state, optimizer)

    # ---- data
    pools = route_tasks(cfg, tasks)
    flops = FlopCounter.for_model(student.cfg)  # totals of every step's `counting()`
    if run.state is not None:
        flops.restore(run.state.extra.get("flops", {}))
    teacher_manifest = {k: {"checkpoint": str(used[r]), "sha256": teacher_manifests[k]["sha256"]}
                        for r in used for k in [partition_key(r)]}
    manifest_extra = {"config": {"mopd": asdict(cfg), "model": asdict(student.cfg),
                                 "qat": (student_manifest.get("config") or {}).get("qat") if cfg.qat else None,
                                 "data": (student_manifest.get("config") or {}).get("data")},
                      "teachers": teacher_manifest,
                      "data_versions": {"student_init": student_manifest["sha256"],
                                        "tokenizer_sha256": tokenizer_sha256(tokenizer),
                                        **{f"teacher/{k}": v["sha256"] for k, v in teacher_manifest.items()}}}

    def save(step: int, path: Path, with_state: bool, metrics: dict | None = None) -> None:
        save_state(path, student, dict(manifest_extra, metrics=metrics or {}), optimizer if with_state else None,
                   step, {"history": run.history, "tokens_seen": run.tokens_seen, "flops": flops.as_dict()})

    # ---- loop
    generator = torch.Generator().manual_seed(cfg.seed)
    for step in loop.steps():
        lr = cfg.lr_at(step)
        set_lr(optimizer, lr)
        # A per-step generator state makes a resumed run sample what the uninterrupted one did.
        generator.manual_seed(cfg.seed * 1_000_003 + step)
        with counting() as step_flops:
            episodes, routes, groups = rollout(student, tokenizer, step_prompts(cfg, step, pools, harnesses), cfg,
                                               generator)
            loss, stats = distill_step(student, teacher_models, episodes, routes, groups, cfg, effort_ids, device)
            grad_norm = optimizer_step(student, optimizer, loss, cfg.grad_clip)
        for kind, value in step_flops.totals.items():
            flops.add(kind, value)
        n_gen = sum(ep.n_generated for ep in episodes)
        run.tokens_seen += n_gen
        metrics = {"train/loss": loss.detach(), "train/grad_norm": grad_norm, "train/lr": lr, "step": step + 1,
                   "rollout/success": sum(ep.reward > 0 for ep in episodes) / len(episodes),
                   "rollout/policy_tokens_per_episode": n_gen / len(episodes), **stats}
        for effort in cfg.efforts:
            lens = [ep.n_generated for ep, r in zip(episodes, routes) if r[1] == effort]
            if lens:
                metrics[f"rollout/tokens_per_answer/{effort}"] = sum(lens) / len(lens)
        loop.end_step(step, metrics, save, tokens=n_gen)
    if loop.stopped:
        return MOPDResult(loop.last_dir, run.history, {}, teacher_manifest, flops.as_dict(), run.from_step)

    # ---- final metrics and checkpoint
    metrics = {"train/tokens_seen": float(run.tokens_seen), **{f"flops/{k}": v for k, v in flops.as_dict().items()}}
    for key in ("kl/exact", "kl/k1_bias", "kl/k1_var", "kl/k3_bias", "kl/k3_var", "mopd/is_capped_frac"):
        values = [h[key] for h in run.history if key in h]
        if values:
            metrics[f"{key}/mean"] = sum(values) / len(values)
    if run.history:
        metrics["kl/exact/first"] = run.history[0]["kl/exact"]
        metrics["kl/exact/last"] = run.history[-1]["kl/exact"]
    loop.log(cfg.steps, metrics)
    save(cfg.steps, loop.final_dir, with_state=False, metrics=metrics)
    return MOPDResult(loop.final_dir, run.history, metrics, teacher_manifest, flops.as_dict(), run.from_step)


# ----------------------------------------------------------------------------------------------
# Evaluation of one policy on many routes

def evaluate_routes(model: K3Model, tokenizer, tasks: Mapping[Route, Sequence], specs: Mapping[str, EffortSpec] | None
                    = None) -> dict[Route, EvalReport]:
    """Every route's tasks at its effort in the training harnesses (`evaluate_together`): the nine
    (domain, effort) cells of tiny's student evaluation are three batched decodes of six episodes,
    not nine of two (86 s of mopd_student's 315 s in the 2026-12-01 make run; 0.39× of the time,
    benchmarks/recipes/mopd_eval.py)."""
    return evaluate_together(model, tokenizer, {r: (ts, r[1], None) for r, ts in tasks.items()}, specs)
