"""The envs policy adapter: episodes kept as the exact sampled ids, many at once (continuous
batching), the same bits at any concurrency, envs stepped concurrently, a wall-clock budget."""

import threading
import time
from dataclasses import replace

import pytest

import torch

import envs
from k3model.engine import SamplingConfig, score
from k3model.model import K3Model
from k3model.config import get_profile
from k3model.train.rollout import Job, TokenFormat, TokenPolicy

# A byte-level format: ids 0–15 are specials, byte b is id 16 + b. Ids the model samples outside the
# byte range reach the env as "?" — they still stay in the episode exactly as sampled.
USER, END, ASSISTANT = 1, 2, 3
BYTES = TokenFormat(
    encode=lambda text: [16 + b for b in text.encode()],
    decode=lambda ids: bytes(i - 16 if 16 <= i < 272 else ord("?") for i in ids).decode(errors="replace"),
    stop_id=END, observation_start=(USER,), observation_end=(END, ASSISTANT))


def test_episodes_step_together_and_keep_the_sampled_ids_and_logprobs():
    torch.manual_seed(0)
    # The smoke profile's 512-token context would end these ~2,000-byte episodes at once; the same
    # model under another name has no context limit.
    model = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded")).eval()
    names = ["slack_post", "gmail_label", "arith_word"]
    env_list = [envs.make_env(name, seed=0, max_steps=3) for name in names]
    policy = TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=6, temperature=1.0),
                         generator=torch.Generator().manual_seed(1))
    seeds = {name: s for s, name in enumerate(names)}
    episodes = policy.run(env_list, seeds=[seeds[n] for n in names])

    # One batch: the three episodes' turns decode side by side, one row each a step.
    assert max(policy.decode_batches) == 3
    assert sum(policy.decode_batches) == sum(ep.n_generated for ep in episodes)
    for env, ep in zip(env_list, episodes):
        assert ep.truncated and ep.stop_reason == "truncated" and len(ep.turns) == 3
        record = ep.record
        assert [s["action"] for s in record["steps"]] == [t.text for t in ep.turns]
        # The sequence is the observations tokenized once each, and the sampled ids as sampled.
        first = BYTES.observation(envs.make_env(env.name, seed=0).reset(seed=seeds[env.name]))
        assert ep.token_ids[: len(first)] == first and ep.turns[0].start == len(first)
        pos = 0
        for k, turn in enumerate(ep.turns):
            assert ep.token_ids[turn.start: turn.start + len(turn.token_ids)] == turn.token_ids
            assert all(ep.generated[turn.start: turn.start + len(turn.token_ids)])
            assert not any(ep.generated[pos: turn.start])
            pos = turn.start + len(turn.token_ids)
            ids, mask, logps = ep.turn_sample(k)
            assert len(ids) == len(mask) == len(logps) == pos and sum(mask) == len(turn.token_ids)
        for k in range(2):  # each later observation sits, encoded once, right before the next turn
            obs_ids = BYTES.observation(record["steps"][k]["observation"])
            assert ep.token_ids[ep.turns[k + 1].start - len(obs_ids): ep.turns[k + 1].start] == obs_ids
        # The recorded model log-probabilities are the training forward's, on the kept ids.
        gen = [i for i, g in enumerate(ep.generated) if g]
        scored = score(model, [ep.token_ids], [gen[0]])[0]
        offset = [i - gen[0] for i in gen]
        torch.testing.assert_close(torch.tensor([scored[o] for o in offset]),
                                   torch.tensor([ep.model_logprobs[i] for i in gen]), rtol=0, atol=1e-5)


def unbounded_model():
    torch.manual_seed(0)
    return K3Model(replace(get_profile("smoke").model, name="smoke-unbounded")).eval()



NAMES = ["slack_post", "gmail_label", "arith_word"]


def jobs_of(n, factory=None):
    """n episodes over three families with 1–4 turns each; every third job repeats the one before
    (the samples of one task: a prompt prefilled once)."""
    jobs = []
    for k in range(n):
        seed = k - 1 if k % 3 == 2 else k
        name, steps = NAMES[seed % 3], 1 + seed % 4
        make = (lambda name=name, steps=steps: envs.make_env(name, seed=0, max_steps=steps)) if factory is None \
            else (lambda name=name, steps=steps: factory(envs.make_env(name, seed=0, max_steps=steps)))
        jobs.append(Job(make, seed=seed, close=True))
    return jobs


def test_a_continuous_batch_gives_every_episode_the_bits_it_gets_alone(one_thread):
    model = unbounded_model()
    # Stop ids on a tenth of the byte range: turns end at different tokens, episodes at different turns.
    cfg = SamplingConfig(max_new_tokens=7, temperature=1.0, top_p=0.9, stop_ids=tuple(range(16, 42)))

    def play(concurrent):
        policy = TokenPolicy(model, BYTES, cfg, generator=torch.Generator().manual_seed(5), max_concurrent=concurrent,
                             episode_budget=15)
        return policy, policy.play(jobs_of(14))

    batched, together = play(5)
    _, alone = play(1)
    assert max(batched.decode_batches) == 5 and min(batched.decode_batches) < 5  # refilled, then drained
    assert len({len(ep.turns) for ep in together}) > 1 and len({ep.stop_reason for ep in together}) > 1
    for a, b in zip(together, alone):
        assert a.token_ids == b.token_ids and a.generated == b.generated
        assert a.logprobs == b.logprobs and a.model_logprobs == b.model_logprobs  # bitwise
        assert (a.reward, a.stop_reason, [t.text for t in a.turns]) == (b.reward, b.stop_reason, [t.text for t in b.turns])
    # The sampling log-probabilities are those of the nucleus distribution the ids were drawn from.
    ep = together[0]
    gen = [i for i, g in enumerate(ep.generated) if g]
    assert all(lp <= 0.0 for lp in ep.logprobs) and any(ep.logprobs[i] != ep.model_logprobs[i] for i in gen)


class SlowEnv:
    """A real env whose every step first sleeps (a slow sandboxed command); counts the steps in flight."""
    lock = threading.Lock()
    inside = 0
    most = 0

    def __init__(self, env, seconds):
        self.env, self.seconds, self.closed = env, seconds, False

    def reset(self, task=None, seed=None):
        return self.env.reset(task=task, seed=seed)

    def step(self, text):
        with SlowEnv.lock:
            SlowEnv.inside += 1
            SlowEnv.most = max(SlowEnv.most, SlowEnv.inside)
        try:
            time.sleep(self.seconds(self) if callable(self.seconds) else self.seconds)
            return self.env.step(text)
        finally:
            with SlowEnv.lock:
                SlowEnv.inside -= 1

    def trajectory(self):
        return self.env.trajectory()

    def close(self):
        self.closed = True
        self.env.close()


def test_envs_step_concurrently():
    # Serial stepping (one env after another) never has two steps in flight.
    SlowEnv.most = 0
    model = unbounded_model()
    policy = TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=3), env_workers=6)
    episodes = policy.play(jobs_of(6, lambda env: SlowEnv(env, 0.3)))
    assert all(ep.stop_reason == "truncated" and ep.record is not None for ep in episodes)
    assert SlowEnv.most >= 2


def test_an_episode_past_its_wall_clock_budget_ends_truncated():
    model = unbounded_model()
    made = []

    def slow_second_turn(env):
        # Job 1's env hangs in its second step; the others answer at once.
        wrapped = SlowEnv(env, lambda me: 8.0 if me is made[1] and len(me.env.trajectory()["steps"]) == 1 else 0.0)
        made.append(wrapped)
        return wrapped

    jobs = jobs_of(2, slow_second_turn)  # job 0: 1 turn; job 1: 2 turns
    policy = TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=3), episode_seconds=1.0)
    t0 = time.monotonic()
    episodes = policy.play(jobs)
    assert time.monotonic() - t0 < 6  # not stalled by the 8-s step
    assert episodes[0].stop_reason == "truncated" and episodes[0].truncated
    hung = episodes[1]
    assert hung.truncated and hung.stop_reason == "wall" and hung.record is None and len(hung.turns) == 2
    assert made[0].closed and not made[1].closed  # closed once its step returns, on its thread


def test_bad_arguments_name_the_field():
    model = unbounded_model()
    for kw in ({"max_concurrent": 0}, {"env_workers": 0}, {"episode_seconds": 0.0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=3), **kw)


def test_a_policy_with_non_finite_logits_is_refused_by_name():
    """NaN logits have nothing to sample from: the inverse-CDF draw would return some id silently (and
    torch.multinomial asserts on the GPU, docs/log/gpu.md session 31); the rollout says what is wrong."""
    model = unbounded_model()
    with torch.no_grad():
        model.lm_head.weight[7].fill_(float("nan"))
    policy = TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=3, temperature=1.0))
    with pytest.raises(FloatingPointError, match=r"logits are not finite \(NaN or \+inf\) in \d of \d episodes \(first: job \d, \w+, turn 1, from the feed of its observation \(the turn's first token\), its cache holding \d+ tokens; \d of the \d at a turn's first token\)"):
        policy.play(jobs_of(2))
