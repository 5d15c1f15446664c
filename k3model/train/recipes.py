"""Every profile's post-training sizes: SFT, the RL ladder and specialists, MOPD and the transfer
folds, the deployment comparison and draft, and the held-out evaluation plan they share.

The model and pretraining sizes are `k3model.config` (profiles) and `datagen.profiles` (data); this
module holds the rest, so "how big is tiny?" is those two and this one. Plain data, no Dagster:
the assets (`assets/posttrain.py`, `distill.py`, `deploy.py`) and the benchmarks that replay a
profile's recipe read it, and a benchmark on the GPU machine (torch only, no Dagster) can too.

smoke runs every asset in seconds (the lineage runs inside the test suite); tiny is sized for
`make run` on 2 cores (measurements: docs/log/posttrain.md, rl.md, mopd.md, deploy-time.md);
small is the GPU-sized run. Seeds (here, below): the held-out evaluation draws tasks from
`EVAL_SEED_BASE`, the transfer folds from `TRANSFER_EVAL_SEED`, far from the RL prompts'
(`RL_SEED_BASE`) and the SFT demonstrations' (`datagen.sft.SFT_TASK_SEED_BASE`).
"""

from __future__ import annotations

from dataclasses import dataclass

from datagen.sft import SFT_FAMILIES
from k3model.train.effort import DOMAINS, EFFORTS, effort_specs, scaled_budgets

# The starter rung of each domain (envs/tasks/starter.py; general_tasks has two).
STARTER_FAMILIES = ("echo_word", "compare_numbers", "slack_ping", "write_answer")
# Task seeds: the ladder's measurement and the RL prompts from RL_SEED_BASE, every held-out
# evaluation from EVAL_SEED_BASE (k3model.train.ladder explains the gap).
RL_SEED_BASE = 0
EVAL_SEED_BASE = 500_000


# ----------------------------------------------------------------------------------------------
# Post-training: SFT, the ladder, the nine specialists

@dataclass(frozen=True)
class PosttrainSizes:
    """How much post-training a profile does."""
    sft_families: tuple[str, ...] | None  # None: every easy and medium family
    sft_tasks_per_family: int
    sft_heldout_tasks_per_family: int
    sft_max_tokens: int
    sft_steps: int
    sft_batch_size: int
    sft_lr: float
    eval_tasks_per_family: int
    # The ladder: tasks per family, and the group size the pass rates are measured at.
    ladder_tasks_per_family: int
    ladder_samples: int
    # Each specialist: GRPO steps, group size G, informative groups per step P, RL prompts and
    # held-out tasks per selected family.
    rl_steps: int
    rl_group_size: int
    rl_groups_per_step: int
    rl_tasks_per_family: int
    rl_eval_tasks_per_family: int
    rl_lr: float
    rl_max_draw_factor: int  # refill draws at most this many times P groups per step (≥ 2: refill on)
    # How specialist and sft_policy are both scored on the held-out tasks: episodes per task, the
    # sampling temperature (0: greedy, one episode per task), and the specialist's hard-split tasks.
    rl_eval_samples: int = 1
    rl_eval_temperature: float = 0.0
    rl_hard_tasks: int = 16
    # (effort, episode budget, turn cap) in policy tokens; None: k3model.train.effort.EFFORT_SPECS
    eval_budgets: tuple[tuple[str, int, int], ...] | None = None
    # (family, w): w × sft_tasks_per_family demonstration tasks for that family (datagen.sft)
    sft_family_weights: tuple[tuple[str, int], ...] = ()


# smoke's (effort, episode budget, turn cap): an echo_word answer in codex (82, 92, 133 policy tokens at
# low, high, max) within the 512-token context.
SMOKE_BUDGETS = (("low", 96, 96), ("high", 112, 112), ("max", 128, 128))

POSTTRAIN_SIZES: dict[str, PosttrainSizes] = {
    # The shortest family of each domain, one task each (echo_word 32), and budgets that hold an
    # echo_word answer: every asset in seconds, so the lineage runs inside the test suite, and the
    # general_tasks specialists really update (issue 45 item 5; docs/log/hardening.md, 2026-12-05).
    # The smoke model's context is 512 tokens (its longest pretraining sequence): only echo_word in
    # codex fits with room for an answer (prompt 404 + answer 82/92 tokens), the other harnesses'
    # prompts leave < 70 tokens and the other domains' prompts do not fit. 200 SFT steps on 32
    # echo_word tasks teach the codex call and the words of its codex demonstrations (not copying:
    # an unseen word is never answered), so 40 RL prompts cover every word and 4 groups a draw (one
    # per training harness, round-robin) × 4 draws give each specialist four codex groups, of which
    # those whose word the policy knows mix successes and failures.
    "smoke": PosttrainSizes(sft_families=("echo_word", "slack_ping", "write_constant"), sft_tasks_per_family=1,
                            sft_heldout_tasks_per_family=1, sft_max_tokens=4096, sft_steps=200, sft_batch_size=4,
                            sft_lr=1e-2, eval_tasks_per_family=1, ladder_tasks_per_family=1, ladder_samples=2,
                            rl_steps=1, rl_group_size=8, rl_groups_per_step=4, rl_tasks_per_family=40,
                            rl_eval_tasks_per_family=1, rl_lr=3e-4, rl_max_draw_factor=4, rl_hard_tasks=1,
                            rl_eval_temperature=1.0,  # sampled, as tiny scores, so the tests run that path
                            eval_budgets=SMOKE_BUDGETS, sft_family_weights=(("echo_word", 32),)),
    # Sized for `make run` on 2 cores (measurements: docs/log/posttrain.md): the 2.75M policy
    # writes its harnesses' calls only after ~2,000 demonstration rows, so SFT trains on four
    # starter rungs alone (one per domain, two for general_tasks), 900 steps × 4 rows; coding's is
    # write_answer, not write_constant (3–13 % on the ladder: docs/log/rl.md, 2026-12-02), and
    # slack_ping has twice the tasks of the others: its word copy (the post's text) is the skill this
    # SFT lost from run to run at equal shares (slack_ping 0.06–0.81 on the ladder). Four ladder
    # tasks per family: the harnesses go round-robin over the tasks, so each family's pass rate
    # covers all four training harnesses, as the specialists' RL groups do. The episode budgets
    # keep low < high < max but are a quarter of effort.EFFORT_SPECS': a policy that never calls
    # finish would otherwise decode 1–4K tokens per episode.
    # RL (docs/log/rl.md, benchmarks/recipes/grpo_sweep.py): no swept setting beat sft_policy on held-out
    # tasks (16 steps, lr 3e-5 … 1e-3, 8–32 episodes a step: −2 … −47 points); 4 RL prompts per
    # family were memorised (held-out 0.55 → 0.25) and lr ≥ 1e-3 broke the call format, so the
    # specialists take 64 prompts per family at lr 1e-4 for 8 steps. Held-out: one episode per task
    # at temperature 1 (the ladder's way; greedy decoding of the tiny policy degenerates), 64 tasks
    # per family, none with an RL prompt's instruction, sft_policy scored the same way on the same
    # tasks: an interval of about ±17 points per single-family cell, ±12 for general_tasks.
    "tiny": PosttrainSizes(sft_families=STARTER_FAMILIES, sft_tasks_per_family=96, sft_heldout_tasks_per_family=4,
                           sft_max_tokens=4096, sft_steps=900, sft_batch_size=4, sft_lr=2e-3,
                           eval_tasks_per_family=4, ladder_tasks_per_family=4, ladder_samples=8,
                           rl_steps=8, rl_group_size=4, rl_groups_per_step=2, rl_tasks_per_family=64,
                           rl_eval_tasks_per_family=64, rl_lr=1e-4, rl_max_draw_factor=2,
                           rl_eval_samples=1, rl_eval_temperature=1.0, rl_hard_tasks=16,
                           eval_budgets=(("low", 256, 128), ("high", 512, 192), ("max", 1024, 256)),
                           sft_family_weights=(("slack_ping", 2),)),
    "small": PosttrainSizes(sft_families=None, sft_tasks_per_family=64, sft_heldout_tasks_per_family=4,
                            sft_max_tokens=16384, sft_steps=2000, sft_batch_size=16, sft_lr=3e-4,
                            eval_tasks_per_family=16, ladder_tasks_per_family=8, ladder_samples=8,
                            rl_steps=100, rl_group_size=8, rl_groups_per_step=8, rl_tasks_per_family=64,
                            rl_eval_tasks_per_family=32, rl_lr=3e-4, rl_max_draw_factor=4),
}


@dataclass(frozen=True)
class EvalPlan:
    """The held-out tasks a policy is scored on: `tasks_per_family` tasks (seeds from `seed`) of each
    of `families` (`k3model.train.ladder.plan_tasks`), grouped by domain, each played once, greedily,
    at every effort in the training harnesses round-robin. `budgets` replaces
    `k3model.train.effort.EFFORT_SPECS`' token budgets as (effort, episode budget, turn cap) triples
    (the smoke profile's hold one echo_word answer)."""
    domains: tuple[str, ...]
    efforts: tuple[str, ...]
    families: tuple[str, ...]
    tasks_per_family: int
    seed: int
    budgets: tuple[tuple[str, int, int], ...] | None = None
    max_episodes_per_batch: int = 64  # episodes live at once (rollout.TokenPolicy's max_concurrent)

    def specs(self) -> dict | None:
        return effort_specs(self.budgets)


def eval_plan(profile: str, tasks_per_family: int | None = None, budget_scale: float = 1.0) -> EvalPlan:
    """The held-out evaluation of `profile`: tasks of the families SFT trained on, seeds from
    this module's `EVAL_SEED_BASE` (disjoint from the RL prompts' and the demonstrations'),
    the same tasks for every policy compared; episode budgets × `budget_scale` (`scaled_budgets`)."""
    sizes = POSTTRAIN_SIZES[profile]
    return EvalPlan(domains=DOMAINS, efforts=EFFORTS, families=sizes.sft_families or SFT_FAMILIES,
                    tasks_per_family=tasks_per_family or sizes.eval_tasks_per_family, seed=EVAL_SEED_BASE,
                    budgets=scaled_budgets(sizes.eval_budgets, budget_scale))


@dataclass(frozen=True)
class SpecialistEval:
    """How a specialist and the SFT policy are scored on held-out tasks, both the same way:
    `samples` episodes per task at `temperature` (0: greedy), and `hard_tasks` tasks of the domain's
    hard split (`k3model.train.ladder.hard_tasks`) for the specialist."""
    temperature: float = 0.0
    samples: int = 1
    hard_tasks: int = 16
    seed: int = 0  # the episodes' generator seed (the same for every policy compared)


def specialist_scoring(profile: str, seed: int) -> SpecialistEval:
    """How `profile` scores policies on held-out cells (`SpecialistEval`): the specialists
    against sft_policy (assets/posttrain.py), the MOPD student against its teachers (assets/distill.py)."""
    sizes = POSTTRAIN_SIZES[profile]
    return SpecialistEval(sizes.rl_eval_temperature, sizes.rl_eval_samples, sizes.rl_hard_tasks, seed)


# ----------------------------------------------------------------------------------------------
# Distillation: MOPD and the cross-harness transfer folds

# Held-out tasks of the cross-harness folds: far from the RL prompts (RL_SEED_BASE = 0) and from the
# other held-out evaluations' seeds (EVAL_SEED_BASE = 500 000).
TRANSFER_EVAL_SEED = 600_000


@dataclass(frozen=True)
class DistillSizes:
    """How much distillation and transfer training a profile does."""
    mopd_steps: int
    mopd_episodes_per_step: int
    mopd_lr: float
    # (effort, episode budget, turn cap) for MOPD's rollouts; None: effort.EFFORT_SPECS (the teachers')
    mopd_budgets: tuple[tuple[str, int, int], ...] | None
    folds: tuple[str, ...]  # held-out harness of each cross-harness fold
    transfer_domain: str
    transfer_effort: str
    transfer_steps: int
    transfer_group_size: int
    transfer_groups_per_step: int
    transfer_rl_tasks: int
    transfer_eval_tasks: int
    transfer_budgets: tuple[tuple[str, int, int], ...] | None


DISTILL_SIZES: dict[str, DistillSizes] = {
    # The transfer folds on general_tasks (echo_word: the one family a smoke policy answers, above),
    # with the specialists' group shape, so the general arm's codex groups can mix.
    "smoke": DistillSizes(mopd_steps=1, mopd_episodes_per_step=3, mopd_lr=1e-4,
                          mopd_budgets=(("low", 8, 4), ("high", 8, 4), ("max", 8, 4)), folds=("openclaw",),
                          transfer_domain="general_tasks", transfer_effort="low", transfer_steps=1,
                          transfer_group_size=8, transfer_groups_per_step=4, transfer_rl_tasks=40,
                          transfer_eval_tasks=2, transfer_budgets=SMOKE_BUDGETS),
    # MOPD's rollouts on tiny run at the teachers' own budgets (the specialists trained and are
    # scored at POSTTRAIN_SIZES["tiny"].eval_budgets): a student cut shorter than its teacher at
    # high/max would be judged against a teacher it cannot imitate.
    "tiny": DistillSizes(mopd_steps=6, mopd_episodes_per_step=9, mopd_lr=5e-5,
                         mopd_budgets=POSTTRAIN_SIZES["tiny"].eval_budgets,
                         folds=("openclaw", "hermes"), transfer_domain="general_agents", transfer_effort="low",
                         transfer_steps=3, transfer_group_size=4, transfer_groups_per_step=2, transfer_rl_tasks=8,
                         transfer_eval_tasks=8,
                         # The specialists' tiny budgets (low: 256 policy tokens, 128 a turn), in training
                         # and evaluation: with effort.EFFORT_SPECS' 1024 the four arms took 559 s of make
                         # run's 2,911 (docs/log/deploy-time.md).
                         transfer_budgets=POSTTRAIN_SIZES["tiny"].eval_budgets),
    "small": DistillSizes(mopd_steps=200, mopd_episodes_per_step=36, mopd_lr=2e-5, mopd_budgets=None,
                          folds=("openclaw", "hermes", "codex", "claude_code", "kimi_code"),
                          transfer_domain="general_agents", transfer_effort="low", transfer_steps=100,
                          transfer_group_size=8, transfer_groups_per_step=8, transfer_rl_tasks=128,
                          transfer_eval_tasks=64, transfer_budgets=None),
}


# ----------------------------------------------------------------------------------------------
# Deployment: the QAT/PTQ comparison and the draft

@dataclass(frozen=True)
class DeploySizes:
    """How much each deployment asset does on a profile."""
    compare_steps: int
    compare_batch_size: int
    compare_max_rows: int | None  # the comparison on the shortest demonstrations only (None: all)
    compare_roundings: tuple[str, ...]  # the scale roundings of the ablation (each repeats the QAT arm)
    draft_steps: int
    draft_batch_size: int
    draft_ttt_steps: int
    draft_gen_tokens: int
    draft_train_prompts: int
    draft_eval_prompts: int
    draft_measure_prompts: int
    draft_measure_tokens: int
    max_prompt_tokens: int
    # Claim 5's judged scope (k3model.train.qat.QUANT_SCOPES), seeds, and held-out windows (n × length).
    compare_scope: str = "all_linear"
    # Peak lr of each comparison arm (SFT from base_model, warmup + cosine). Not the profile's sft_lr:
    # at tiny, 120 steps of batch 4 at sft_lr 2e-3 left every arm at the uniform distribution
    # (held-out window NLL 8.30 ≈ ln 4096) in the session-24 make run; 3e-4 fell to 6.03 (docs/log/deploy.md).
    compare_lr: float = 3e-4
    compare_seeds: tuple[int, ...] = (0, 1)
    compare_windows: int = 8
    compare_window_len: int = 512


DEPLOY_SIZES: dict[str, DeploySizes] = {
    "smoke": DeploySizes(compare_steps=2, compare_batch_size=2, compare_max_rows=3,
                         compare_roundings=("ceil",), compare_windows=2, compare_window_len=64, compare_lr=1e-2, draft_steps=2,
                         draft_batch_size=2, draft_ttt_steps=3, draft_gen_tokens=6, draft_train_prompts=4,
                         draft_eval_prompts=2, draft_measure_prompts=1, draft_measure_tokens=6,
                         max_prompt_tokens=4096),
    "tiny": DeploySizes(compare_steps=120, compare_batch_size=4, compare_max_rows=48,
                        compare_roundings=("ceil", "floor"), draft_steps=60,
                        draft_batch_size=8, draft_ttt_steps=6, draft_gen_tokens=48, draft_train_prompts=96,
                        draft_eval_prompts=16, draft_measure_prompts=4, draft_measure_tokens=48,
                        max_prompt_tokens=400),
    "small": DeploySizes(compare_steps=500, compare_batch_size=16, compare_max_rows=None,
                         compare_roundings=("ceil", "floor"), draft_steps=2000,
                         draft_batch_size=32, draft_ttt_steps=6, draft_gen_tokens=256, draft_train_prompts=4096,
                         draft_eval_prompts=128, draft_measure_prompts=32, draft_measure_tokens=256,
                         max_prompt_tokens=4096),
}
