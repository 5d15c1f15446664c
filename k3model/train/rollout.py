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

Many episodes play at once (continuous batching, `TokenPolicy`): a decode batch of every episode
in its turn, one token per row a step; a row whose turn ends leaves (keeping its one-row cache)
while its env steps on a thread pool, and rejoins once the observation's ids are fed to that
cache; an episode that ends frees its place for the next one queued. Nothing is prefilled twice,
and the first observation of the samples of one task is prefilled once. Each episode samples
from its own stream (engine.sample's inverse-CDF draw from per-episode uniforms), so with the
engine's batch invariance an episode's ids and log-probabilities are the same bits at any
concurrency and under any env timing (tests/k3model/train/test_rollout.py).
Legend: B rows of the decode batch, V vocabulary.
"""

from __future__ import annotations

import os
import random
import time
from collections import OrderedDict, deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

import torch

from k3model.cache import ModelCache
from k3model.engine import (FINISH_LENGTH, MIN_ROWS, Completion, SamplingConfig, SlotBatch, _record,
                            context_length, last_logits, sample)
from k3model.train.common import autocast_for
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


@dataclass(frozen=True)
class Job:
    """One episode to play: `env` is an env, or a callable that makes one (called on a pool thread
    when the episode starts); `close` closes the env when the episode ends."""
    env: Any
    task: Any = None
    seed: int | None = None
    close: bool = False


@dataclass(eq=False)
class _Slot:
    """An admitted episode's state in the scheduler of `TokenPolicy.play`."""
    job: int
    env: Any
    ep: Episode
    rng: random.Random  # the episode's own sampling stream (engine.sample's uniforms)
    deadline: float
    close: bool
    future: Future | None = None  # the env's reset or step, running on the pool
    pending: list[int] | None = None  # ids to feed before the next turn (the whole first observation on turn 1)
    cache: ModelCache | None = None  # one row, between turns
    logits_V: torch.Tensor | None = None  # after the last fed id, until the slot joins the batch
    turn: Completion | None = None  # the turn being decoded
    budget: int = 0
    row: int | None = None  # its slot in the decode batch while it decodes


class TokenPolicy:
    """Plays episodes with one model, many at once; `decode_batches` lists each decode step's rows.

    Continuous batching: up to `max_concurrent` episodes are live; each decode step samples one
    token for every episode in its turn, an episode whose turn ends leaves the batch (keeping its
    cache, one row) while its env steps on a thread pool of `env_workers`, and rejoins once the
    observation is fed; an episode that ends frees its place for the next job in the queue. The
    env steps run concurrently, so one slow env (a sandboxed command) stalls only its own episode;
    `episode_seconds` (None: no limit) ends an episode that runs longer as truncated (stop_reason
    "wall"; an env step still running is left to finish on its thread and the env is closed then).

    Each episode samples from its own stream (seeded from `generator` in job order), through
    engine.sample's inverse-CDF draw: with the engine's batch invariance (CPU, one intra-op
    thread) an episode's ids and log-probabilities do not depend on the batch, the concurrency or
    the env timings — `max_concurrent=1` is the reference a batched run is tested against.

    `cfg.max_new_tokens` caps one turn; `episode_budget` (None: no cap) caps the generated tokens of
    a whole episode: an episode that spends it without ending is truncated (stop_reason "budget";
    the env never sees the cut-off turn's text, so it is not rewarded)."""

    def __init__(self, model, fmt: TokenFormat, cfg: SamplingConfig, *, generator: torch.Generator | None = None,
                 episode_budget: int | None = None, max_concurrent: int = 64, env_workers: int | None = None,
                 episode_seconds: float | None = None, graphed: bool | None = None):
        if cfg.max_new_tokens < 1:
            raise ValueError(f"a policy turn needs max_new_tokens ≥ 1, got {cfg.max_new_tokens}")
        if episode_budget is not None and episode_budget < 1:
            raise ValueError(f"episode_budget must be ≥ 1 or None, got {episode_budget}")
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be ≥ 1, got {max_concurrent}")
        if env_workers is not None and env_workers < 1:
            raise ValueError(f"env_workers must be ≥ 1 or None (bounded by the machine), got {env_workers}")
        if episode_seconds is not None and not episode_seconds > 0:
            raise ValueError(f"episode_seconds must be > 0 or None (no wall-clock limit), got {episode_seconds}")
        self.model, self.fmt, self.generator = model, fmt, generator
        self.episode_budget, self.max_concurrent, self.episode_seconds = episode_budget, max_concurrent, episode_seconds
        self.graphed = graphed  # SlotBatch's: None replays a captured step where the model allows (CUDA, bf16)
        # Env steps mostly wait (sandboxed processes, I/O): a few threads per core, never more than
        # there are episodes to step.
        self.env_workers = env_workers or min(max_concurrent, 4 * (os.cpu_count() or 1))
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
        return self.play([Job(env, task, seed) for env, task, seed in zip(envs, tasks, seeds)])

    @torch.no_grad()
    def play(self, jobs: Sequence[Job]) -> list[Episode]:
        """Play every job's episode, at most `max_concurrent` at once; episodes in job order."""
        if not jobs:
            return []
        if self.generator is not None:
            seeds = torch.randint(0, 2 ** 62, (len(jobs),), generator=self.generator,
                                  device=self.generator.device).tolist()
        else:
            seeds = torch.randint(0, 2 ** 62, (len(jobs),)).tolist()
        model = self.model
        was_training = model.training
        model.eval()
        pool = ThreadPoolExecutor(max_workers=self.env_workers, thread_name_prefix="env-step")
        try:
            # The weights stay fixed for the whole run: QAT's fake-quantized expert weights once, not per step.
            # On CUDA the episodes decode under the training step's bf16 autocast, through the captured
            # step (engine.GraphStep; an fp32 model outside autocast would decode eagerly).
            with frozen_expert_weights(model), autocast_for(next(model.parameters()).device, captured=True):
                return self._schedule(list(jobs), seeds, pool)
        finally:
            model.train(was_training)
            pool.shutdown(wait=False, cancel_futures=True)

    def _schedule(self, jobs: list[Job], seeds: list[int], pool: ThreadPoolExecutor) -> list[Episode]:
        model, fmt = self.model, self.fmt
        limit = context_length(model) or float("inf")
        device = next(model.parameters()).device
        out: list[Episode | None] = [None] * len(jobs)
        queue = deque(range(len(jobs)))
        slots: list[_Slot] = []
        batch = SlotBatch(model, max(MIN_ROWS, min(self.max_concurrent, len(jobs))), graphed=self.graphed)
        row_of: list[_Slot | None] = [None] * batch.rows  # the episode in each slot of the batch
        logits_BV = torch.zeros(batch.rows, model.cfg.vocab_size, device=device)
        closing: list[Future] = []
        prompts: "OrderedDict[tuple[int, ...], tuple[ModelCache, torch.Tensor]]" = OrderedDict()
        greedy = SamplingConfig(max_new_tokens=0)
        sampled = self.cfg.temperature > 0

        def finish(s: _Slot) -> None:
            slots.remove(s)
            out[s.job] = s.ep
            if s.row is not None:
                batch.leave(s.row)
                row_of[s.row] = None
            s.row, s.cache, s.logits_V, s.pending = None, None, None, None
            if s.close:
                if s.future is None:
                    closing.append(pool.submit(s.env.close))
                else:  # still resetting or stepping: close once that returns
                    s.future.add_done_callback(partial(_close_after, s.env))

        try:
            while queue or slots:
                while queue and len(slots) < self.max_concurrent:
                    j = queue.popleft()
                    job = jobs[j]
                    slot = _Slot(j, None, Episode(), random.Random(seeds[j]),
                                 time.monotonic() + (self.episode_seconds or float("inf")), job.close)
                    slot.future = pool.submit(_reset, job)
                    slots.append(slot)
                stepping = [s for s in slots if s.future is not None]
                if stepping and not any(s.row is not None or s.pending is not None for s in slots):
                    # Nothing to decode: wait for an env, at most until the next deadline.
                    timeout = min(s.deadline for s in slots) - time.monotonic()
                    wait([s.future for s in stepping], timeout=None if timeout == float("inf") else max(timeout, 0),
                         return_when=FIRST_COMPLETED)
                for s in stepping:
                    if not s.future.done():
                        continue
                    future, s.future = s.future, None
                    if s.env is None:
                        s.env, obs = future.result()
                        ids = fmt.first_observation(obs)
                        s.ep.append(ids, generated=False)
                        s.pending = ids
                        if not self._room(s.ep, limit):
                            s.ep.truncated = True
                            self._end(s, "context")
                    else:
                        self._after_step(s, future.result(), limit)
                    if s.ep.stop_reason:
                        finish(s)
                now = time.monotonic()
                for s in [s for s in slots if now >= s.deadline]:
                    self._out_of_time(s)
                    finish(s)
                # Feed what the ready episodes still have to read; they join the batch.
                for s in [s for s in slots if s.pending is not None]:
                    self._feed(s, prompts, device, limit)
                    s.row = batch.join(s.cache, s.cache.lengths[0] + s.budget)
                    row_of[s.row] = s
                    logits_BV[s.row] = s.logits_V
                    s.cache, s.logits_V = None, None
                if not queue and len(slots) <= batch.rows // 2:
                    # The queue is empty: the last episodes need fewer slots.
                    order = batch.shrink(len(slots))
                    if order is not None:
                        row_of = [row_of[b] for b in order]
                        logits_BV = logits_BV[torch.tensor(order, device=device)]
                        for b, s in enumerate(row_of):
                            if s is not None:
                                s.row = b
                live = [b for b, s in enumerate(row_of) if s is not None]
                if not live:
                    continue
                # One decode step over the batch (free slots: greedy, ignored).
                row_cfgs = [self.cfg if s is not None else greedy for s in row_of]
                uniforms = [s.rng.random() if s is not None and sampled else 0.0 for s in row_of]
                tokens_B, logp_B, model_logp_B = sample(logits_BV, row_cfgs, uniforms=uniforms)
                tokens, logps, model_logps = tokens_B.tolist(), logp_B.tolist(), model_logp_B.tolist()
                broken = [b for b in live if model_logps[b] != model_logps[b]]
                if broken:  # log_softmax is NaN across a row holding a NaN or +inf logit
                    raise FloatingPointError(self._not_finite([row_of[b] for b in broken], len(live), batch))
                self.decode_batches.append(len(live))
                for b in live:
                    s = row_of[b]
                    if not _record(s.turn, tokens[b], logps[b], model_logps[b], self.cfg, s.budget):
                        continue
                    # Its cache holds every sampled id but the last (never fed).
                    s.cache, s.row, row_of[b] = batch.leave(b), None, None
                    text = self._turn_text(s)
                    if text is not None:
                        s.future = pool.submit(s.env.step, text)
                    else:
                        s.cache = None
                        finish(s)
                if any(s is not None for s in row_of):
                    logits_BV = batch.step(tokens_B)
        finally:
            for s in slots:  # an error: close what was opened
                if s.close and s.env is not None and s.future is None:
                    closing.append(pool.submit(s.env.close))
            for f in closing:
                f.result()
        return out

    @staticmethod
    def _not_finite(rows: list[_Slot], live: int, batch: SlotBatch) -> str:
        """What a rollout says of rows whose logits are not finite: which episodes, and which forward
        produced them — the feed of the turn's observation (the turn's first token) or a decode step
        of the batch (captured or eager), with the row's cache length."""
        s = rows[0]
        at = len(s.turn.token_ids)
        source = ("the feed of its observation (the turn's first token)" if at == 0 else
                  f"a {'captured' if batch.graphed else 'eager'} decode step (token {at + 1} of the turn)")
        feeds = sum(len(r.turn.token_ids) == 0 for r in rows)
        return (f"the policy's logits are not finite (NaN or +inf) in {len(rows)} of {live} episodes "
                f"(first: job {s.job}, {getattr(s.env, 'name', type(s.env).__name__)}, turn {len(s.ep.turns) + 1}, "
                f"from {source}, its cache holding {batch.cache.lengths[s.row]} tokens; {feeds} of the {len(rows)} "
                f"at a turn's first token): its weights or that forward produce them — nothing to sample from")

    def _feed(self, s: _Slot, prompts: "OrderedDict", device, limit) -> None:
        """Run the slot's pending ids through its cache (the first observation: a prefill, shared by
        the episodes of one prompt) and start its next turn."""
        model, ids = self.model, s.pending
        if s.cache is None:
            key = tuple(ids)
            if key not in prompts:
                cache = ModelCache.empty(model, 1, capacity=len(ids) + self.cfg.max_new_tokens)
                fed = model(torch.tensor([ids], device=device), cache=cache, logits=False)
                prompts[key] = (cache, last_logits(model, fed.hidden_BTD)[0])
                # A GRPO group's samples start together: a few prompts cover the episodes in flight.
                while len(prompts) > 16:
                    prompts.popitem(last=False)
            cache, first = prompts[key]
            s.cache, s.logits_V = cache, first  # joining the batch copies it: the cache stays as prefilled
        else:
            fed = model(torch.tensor([ids], device=device), cache=s.cache, logits=False)
            s.logits_V = last_logits(model, fed.hidden_BTD)[0]
        s.pending = None
        s.budget = int(min(self.cfg.max_new_tokens, limit - len(s.ep.token_ids), self._left(s.ep)))
        s.turn = Completion([], [], [], FINISH_LENGTH)

    def _turn_text(self, s: _Slot) -> str | None:
        """Record the finished turn; the text for the env, or None when the episode ended here."""
        fmt, ep, done = self.fmt, s.ep, s.turn
        ids = done.token_ids
        ep.turns.append(PolicyTurn(len(ep.token_ids), ids, done.logprobs, done.model_logprobs, done.finish_reason, ""))
        ep.append(ids, generated=True, logprobs=done.logprobs, model_logprobs=done.model_logprobs)
        s.turn = None
        if ids[-1] != fmt.stop_id and self._left(ep) <= 0:
            # The episode budget ran out inside this turn: the cut-off text is never acted on.
            ep.truncated = True
            self._end(s, "budget")
            return None
        text = fmt.decode(ids[:-1] if ids[-1] == fmt.stop_id else ids)
        ep.turns[-1].text = text
        return text

    def _after_step(self, s: _Slot, result, limit) -> None:
        """Take the env's answer to the last turn: end the episode, or queue the observation's ids."""
        fmt, ep = self.fmt, s.ep
        obs, reward, terminated, truncated, info = result
        ids = ep.turns[-1].token_ids
        ep.turns[-1].error = info.get("error")
        ep.reward += reward
        if terminated or truncated:
            ep.terminated, ep.truncated = terminated, truncated
            self._end(s, "terminated" if terminated else "truncated")
            return
        # A turn cut off by max_new_tokens still ends with the stop id (not model-generated).
        end = [] if ids[-1] == fmt.stop_id else [fmt.stop_id]
        obs_ids = fmt.observation(obs)
        ep.append(end + obs_ids, generated=False)
        # The last sampled id was never fed to the cache: it leads the next feed.
        s.pending = [ids[-1]] + end + obs_ids
        if not self._room(ep, limit) or self._left(ep) <= 0:
            ep.truncated = True
            self._end(s, "budget" if self._left(ep) <= 0 else "context")

    def _out_of_time(self, s: _Slot) -> None:
        """End an episode past its wall-clock budget as truncated; a turn being decoded is kept (its
        ids as sampled), never acted on."""
        if s.turn is not None and s.turn.token_ids:
            done, ep = s.turn, s.ep
            ep.turns.append(PolicyTurn(len(ep.token_ids), done.token_ids, done.logprobs, done.model_logprobs,
                                       done.finish_reason, ""))
            ep.append(done.token_ids, generated=True, logprobs=done.logprobs, model_logprobs=done.model_logprobs)
        s.turn, s.pending = None, None
        s.ep.truncated = True
        # An env still stepping (or resetting) is busy on its thread: its trajectory is not read.
        self._end(s, "wall", record=s.future is None and s.env is not None)

    def _left(self, ep: Episode) -> float:
        return float("inf") if self.episode_budget is None else self.episode_budget - ep.n_generated

    @staticmethod
    def _room(ep: Episode, limit) -> bool:
        return len(ep.token_ids) < limit

    @staticmethod
    def _end(s: _Slot, reason: str, record: bool = True) -> None:
        s.ep.stop_reason = reason
        trajectory = getattr(s.env, "trajectory", None) if record else None
        s.ep.record = trajectory() if callable(trajectory) else None


def _close_after(env, future: Future) -> None:
    """Close an env whose episode ended (out of time) while its reset or step ran."""
    if env is None:  # it was still being made: the reset's result holds it
        if future.cancelled() or future.exception() is not None:
            return
        env = future.result()[0]
    env.close()


def _reset(job: Job):
    """On a pool thread: make the env (if the job holds a factory) and reset it; (env, first observation)."""
    env = job.env() if callable(job.env) and not hasattr(job.env, "reset") else job.env
    return env, env.reset(task=job.task, seed=job.seed)


def play_tasks(model, fmt: TokenFormat, tasks: Sequence, harnesses: Sequence[str], cfg: SamplingConfig, *,
               samples: int = 1, episode_budget: int | None = None, generator: torch.Generator | None = None,
               max_episodes_per_batch: int = 64, episode_seconds: float | None = None) -> list[tuple[int, str, Episode]]:
    """`samples` episodes of each envs task (tasks[i] in harnesses[i]), played by one TokenPolicy:
    at most `max_episodes_per_batch` live at once, refilled from the queue as episodes end, a task's
    samples queued side by side (their shared prompt is prefilled once). Returns (task index,
    harness, episode) per episode, task-major; each env is made when its episode starts and closed
    (its sandbox removed) when it ends."""
    import envs as envs_pkg
    if len(harnesses) != len(tasks):
        raise ValueError(f"give one harness per task: {len(tasks)} tasks, {len(harnesses)} harnesses")
    if samples < 1 or max_episodes_per_batch < 1:
        raise ValueError(f"samples and max_episodes_per_batch must be ≥ 1, got {samples}, {max_episodes_per_batch}")
    jobs = [(i, harnesses[i]) for i in range(len(tasks)) for _ in range(samples)]
    policy = TokenPolicy(model, fmt, cfg, generator=generator, episode_budget=episode_budget,
                         max_concurrent=max_episodes_per_batch, episode_seconds=episode_seconds)
    episodes = policy.play([Job(partial(envs_pkg.make_env, tasks[i].family, harness=h), tasks[i], close=True)
                            for i, h in jobs])
    return [(i, h, ep) for (i, h), ep in zip(jobs, episodes)]
