"""The rollouter: episodes of `envs` played by a K3 model, kept as token ids (DESIGN.md §8 envs;
STYLE.md's generator / rollouter split: the engine generates, this module runs the episodes).

An episode is one growing sequence of ids, never re-tokenized (research/posttrain-anchors.md §1.4:
decoding sampled ids to text and encoding the text again does not give the same ids):

    ids = start(obs₀) · gen₁ · stop? · start(obs₁) · gen₂ · …
    start(obs) = observation_start + encode(obs) + observation_end      tokenized once, appended
    gen_i      = the ids the model sampled in turn i, as sampled (its stop id included)
    stop       = the stop id, when a turn ran out of tokens before sampling it (not model-generated)

Each token carries `generated` (True only for ids the model sampled: the loss mask) and the
log-probabilities the engine recorded (under the sampling distribution and under the untempered
model; 0.0 on other tokens). Only the env sees text: `decode(gen_i)` minus the stop id.

Many episodes step together: per turn, every unfinished episode's cache is extended by its new
tokens (the first turn prefills), the caches are stacked, and one batched `engine.decode` samples
all their replies; each episode keeps its own cache between turns, so nothing is prefilled twice.
Legend: B episodes in the turn, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from k3model.cache import ModelCache
from k3model.engine import SamplingConfig, context_length, decode, last_logits
from k3model.train.qat import frozen_expert_weights


@dataclass(frozen=True)
class TokenFormat:
    """How text enters and leaves an episode's ids."""
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    stop_id: int  # the model's end of turn: generation stops there and the id stays in the episode
    observation_start: tuple[int, ...] = ()  # e.g. (<|user|>,)
    observation_end: tuple[int, ...] = ()  # e.g. (<|end|>, <|assistant|>): the model's turn follows
    first_start: tuple[int, ...] | None = None  # around the first observation (None: as any other)
    first_end: tuple[int, ...] | None = None

    def observation(self, text: str) -> list[int]:
        return [*self.observation_start, *self.encode(text), *self.observation_end]

    def first_observation(self, text: str) -> list[int]:
        start = self.observation_start if self.first_start is None else self.first_start
        end = self.observation_end if self.first_end is None else self.first_end
        return [*start, *self.encode(text), *end]


def sft_format(tokenizer, effort: str) -> TokenFormat:
    """The conversation format of `datagen.sft` at one effort (the same special ids, built by
    `datagen.sft.turn_tokens`): the first observation behind <|bos|><|system|><|effort_E|>, later
    ones as tool results; the env sees each turn's text after its scratchpad (`action_ids`)."""
    from datagen.sft import action_ids, turn_tokens
    from datagen.tokenizer import decode, encode
    turn = turn_tokens(tokenizer, effort)
    return TokenFormat(encode=lambda text: encode(tokenizer, text),
                       decode=lambda ids: decode(tokenizer, action_ids(turn, list(ids))),
                       stop_id=turn.stop_id, observation_start=turn.observation_start,
                       observation_end=turn.observation_end, first_start=turn.first_start,
                       first_end=turn.first_end)


@dataclass
class PolicyTurn:
    start: int  # index in Episode.token_ids of this turn's first generated id
    token_ids: list[int]
    logprobs: list[float]
    model_logprobs: list[float]
    finish_reason: str
    text: str  # what the env was given
    error: str | None = None  # the env's parse error for this turn (no readable call, budget spent)


@dataclass
class Episode:
    token_ids: list[int] = field(default_factory=list)
    generated: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    model_logprobs: list[float] = field(default_factory=list)
    turns: list[PolicyTurn] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    stop_reason: str = ""  # "terminated", "truncated" (the env's budget), "context" (the model's) or
    # "budget" (the policy's episode budget of generated tokens)
    record: dict[str, Any] | None = None  # env.trajectory()

    def append(self, ids: Sequence[int], generated: bool, logprobs=None, model_logprobs=None) -> None:
        self.token_ids += list(ids)
        self.generated += [generated] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.model_logprobs += list(model_logprobs) if model_logprobs is not None else [0.0] * len(ids)

    @property
    def n_generated(self) -> int:
        return sum(len(t.token_ids) for t in self.turns)

    def turn_sample(self, i: int) -> tuple[list[int], list[bool], list[float]]:
        """Policy turn i as a step-wise training sample: the ids up to its end, which of them turn i
        generated, and their sampling log-probabilities."""
        turn = self.turns[i]
        end = turn.start + len(turn.token_ids)
        mask = [False] * turn.start + [True] * len(turn.token_ids)
        return self.token_ids[:end], mask, self.logprobs[:end]


class TokenPolicy:
    """Runs batches of episodes with one model; `decode_batches` lists each turn's batch size.

    `cfg.max_new_tokens` caps one turn; `episode_budget` (None: no cap) caps the generated tokens of
    a whole episode: an episode that spends it without ending is truncated (stop_reason "budget";
    the env never sees the cut-off turn's text, so it is not rewarded)."""

    def __init__(self, model, fmt: TokenFormat, cfg: SamplingConfig, *, generator: torch.Generator | None = None,
                 episode_budget: int | None = None):
        if cfg.max_new_tokens < 1:
            raise ValueError(f"a policy turn needs max_new_tokens ≥ 1, got {cfg.max_new_tokens}")
        if episode_budget is not None and episode_budget < 1:
            raise ValueError(f"episode_budget must be ≥ 1 or None, got {episode_budget}")
        self.model, self.fmt, self.generator = model, fmt, generator
        self.episode_budget = episode_budget
        self.cfg = SamplingConfig(cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p,
                                  stop_ids=tuple(dict.fromkeys((*cfg.stop_ids, fmt.stop_id))))
        self.decode_batches: list[int] = []

    @torch.no_grad()
    def run(self, envs: Sequence, seeds: Sequence[int | None] | None = None,
            tasks: Sequence | None = None) -> list[Episode]:
        """Play one episode in each env (reset with tasks[i], else seeds[i]) until every one has ended."""
        seeds = [None] * len(envs) if seeds is None else list(seeds)
        tasks = [None] * len(envs) if tasks is None else list(tasks)
        if len(seeds) != len(envs) or len(tasks) != len(envs):
            raise ValueError(f"give one seed and one task (or None) per env: {len(envs)} envs, {len(seeds)} seeds, "
                             f"{len(tasks)} tasks")
        model, fmt = self.model, self.fmt
        limit = context_length(model) or float("inf")
        device = next(model.parameters()).device
        episodes = [Episode() for _ in envs]
        pending = []  # ids each episode still has to feed to its cache before its next turn
        for env, seed, task, ep in zip(envs, seeds, tasks, episodes):
            ids = fmt.first_observation(env.reset(task=task, seed=seed))
            ep.append(ids, generated=False)
            pending.append(ids)
        caches: list[ModelCache | None] = [None] * len(envs)
        active = [i for i, ep in enumerate(episodes) if self._room(ep, limit)]
        for i in sorted(set(range(len(envs))) - set(active)):
            episodes[i].truncated = True
            self._end(envs[i], episodes[i], "context")
        was_training = model.training
        model.eval()
        try:
            # The weights stay fixed for the whole run: QAT's fake-quantized expert weights once, not per step.
            with frozen_expert_weights(model):
                self._play(envs, episodes, pending, caches, active, limit, device)
        finally:
            model.train(was_training)
        return episodes

    def _play(self, envs, episodes: list[Episode], pending: list, caches: list, active: list[int], limit,
              device) -> None:
        """The turns of `run`: until no episode in `active` goes on, one batched decode per turn."""
        model = self.model
        while active:
            logits: dict[int, torch.Tensor] = {}
            # First turns with the same prompt (a GRPO group, samples of one task) prefill once
            # and fork: the copies hold the same bits the separate prefills would.
            fresh: dict[tuple[int, ...], list[int]] = {}
            for i in active:
                if caches[i] is None:
                    fresh.setdefault(tuple(pending[i]), []).append(i)
            for prompt, members in fresh.items():
                cache = ModelCache.empty(model, 1, capacity=len(prompt) + self.cfg.max_new_tokens)
                out = model(torch.tensor([prompt], device=device), cache=cache, logits=False)
                first = last_logits(model, out.hidden_BTD)[0]
                copies = cache.fork(len(members)) if len(members) > 1 else cache
                for k, i in enumerate(members):
                    caches[i] = copies.select([k]) if len(members) > 1 else copies
                    logits[i] = first
            for i in active:
                if i not in logits:
                    out = model(torch.tensor([pending[i]], device=device), cache=caches[i], logits=False)
                    logits[i] = last_logits(model, out.hidden_BTD)[0]
            budgets = [int(min(self.cfg.max_new_tokens, limit - len(episodes[i].token_ids),
                               self._left(episodes[i]))) for i in active]
            batch = caches[active[0]] if len(active) == 1 else ModelCache.cat([caches[i] for i in active])
            self.decode_batches.append(len(active))
            done, finals = decode(model, batch, torch.stack([logits[i] for i in active]), [self.cfg] * len(active), budgets,
                                  generator=self.generator, keep_caches=True)
            still = []
            for i, completion, cache in zip(active, done, finals):
                if self._turn(envs[i], episodes[i], completion, pending, i):
                    caches[i] = cache
                    still.append(i)
                else:
                    caches[i] = None
            active = still

    def _turn(self, env, ep: Episode, completion, pending: list, i: int) -> bool:
        """Record a policy turn and step the env; True while the episode goes on."""
        fmt = self.fmt
        ids = completion.token_ids
        ep.turns.append(PolicyTurn(len(ep.token_ids), ids, completion.logprobs, completion.model_logprobs,
                                   completion.finish_reason, ""))
        ep.append(ids, generated=True, logprobs=completion.logprobs, model_logprobs=completion.model_logprobs)
        if ids[-1] != fmt.stop_id and self._left(ep) <= 0:
            # The episode budget ran out inside this turn: the cut-off text is never acted on.
            ep.truncated = True
            self._end(env, ep, "budget")
            return False
        text = fmt.decode(ids[:-1] if ids[-1] == fmt.stop_id else ids)
        ep.turns[-1].text = text
        obs, reward, terminated, truncated, info = env.step(text)
        ep.turns[-1].error = info.get("error")
        ep.reward += reward
        if terminated or truncated:
            ep.terminated, ep.truncated = terminated, truncated
            self._end(env, ep, "terminated" if terminated else "truncated")
            return False
        # A turn cut off by max_new_tokens still ends with the stop id (not model-generated).
        end = [] if ids[-1] == fmt.stop_id else [fmt.stop_id]
        obs_ids = fmt.observation(obs)
        ep.append(end + obs_ids, generated=False)
        # The last sampled id was never fed to the cache: it leads the next feed.
        pending[i] = [ids[-1]] + end + obs_ids
        if not self._room(ep, context_length(self.model) or float("inf")) or self._left(ep) <= 0:
            ep.truncated = True
            self._end(env, ep, "budget" if self._left(ep) <= 0 else "context")
            return False
        return True

    def _left(self, ep: Episode) -> float:
        return float("inf") if self.episode_budget is None else self.episode_budget - ep.n_generated

    @staticmethod
    def _room(ep: Episode, limit) -> bool:
        return len(ep.token_ids) < limit

    @staticmethod
    def _end(env, ep: Episode, reason: str) -> None:
        ep.stop_reason = reason
        trajectory = getattr(env, "trajectory", None)
        ep.record = trajectory() if callable(trajectory) else None


def play_tasks(model, fmt: TokenFormat, tasks: Sequence, harnesses: Sequence[str], cfg: SamplingConfig, *,
               samples: int = 1, episode_budget: int | None = None, generator: torch.Generator | None = None,
               max_episodes_per_batch: int = 32) -> list[tuple[int, str, Episode]]:
    """`samples` episodes of each envs task (tasks[i] in harnesses[i]), many at once: batches of at
    most `max_episodes_per_batch` episodes, one batched decode per turn, a task's samples side by
    side (their shared prompt is prefilled once). Returns (task index, harness, episode) per episode,
    task-major; every env is closed (its sandbox removed) when its batch ends."""
    import envs as envs_pkg
    if len(harnesses) != len(tasks):
        raise ValueError(f"give one harness per task: {len(tasks)} tasks, {len(harnesses)} harnesses")
    if samples < 1 or max_episodes_per_batch < 1:
        raise ValueError(f"samples and max_episodes_per_batch must be ≥ 1, got {samples}, {max_episodes_per_batch}")
    jobs = [(i, harnesses[i]) for i in range(len(tasks)) for _ in range(samples)]
    policy = TokenPolicy(model, fmt, cfg, generator=generator, episode_budget=episode_budget)
    out: list[tuple[int, str, Episode]] = []
    for at in range(0, len(jobs), max_episodes_per_batch):
        part = jobs[at: at + max_episodes_per_batch]
        env_list = [envs_pkg.make_env(tasks[i].family, harness=h) for i, h in part]
        try:
            episodes = policy.run(env_list, tasks=[tasks[i] for i, _ in part])
        finally:
            for env in env_list:
                env.close()
        out += [(i, h, ep) for (i, h), ep in zip(part, episodes)]
    return out
