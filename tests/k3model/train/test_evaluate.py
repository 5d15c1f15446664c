"""Evaluation: SFT's prompt format in every episode, verifier rewards, Wilson intervals, the report."""

from dataclasses import replace

import pytest
import torch

import envs
from datagen.sft import action_ids, turn_tokens
from datagen.tokenizer import encode
from k3model.config import get_profile
from k3model.engine import SamplingConfig
from k3model.model import K3Model
from k3model.train.evaluate import EvalReport, evaluate, summarize, wilson_interval
from k3model.train.effort import EffortSpec
from k3model.train.rollout import Episode, PolicyTurn, play_tasks, sft_format

# Short budgets keep a random model's episodes to a few dozen tokens.
SPECS = {e: EffortSpec(budget_tokens=12, length_coef=0.0, turn_tokens=6) for e in ("low", "high", "max")}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    # The smoke context (512) is shorter than a smoke-tokenized prompt; the same model unnamed has none.
    return K3Model(replace(get_profile("smoke").model, name="smoke-unbounded")).eval()


def test_wilson_interval_matches_hand_computed_values():
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(3, 2)


def test_episodes_start_exactly_as_the_sft_rows_do(model, smoke_tok, demos):
    # The row's prompt (everything before its first own token) is the episode's first feed.
    for row in demos.to_pylist():
        first_own = row["loss_mask"].index(1)
        task = envs.generate(row["family"], row["task_seed"])
        [(_, _, ep)] = play_tasks(model, sft_format(smoke_tok, row["effort"]), [task], [row["harness"]],
                                  SamplingConfig(max_new_tokens=2), episode_budget=2)
        assert ep.token_ids[: ep.turns[0].start] == row["input_ids"][:first_own]
        assert ep.stop_reason == "budget" and ep.n_generated == 2


def test_the_env_sees_the_text_after_the_scratchpad(smoke_tok):
    turn = turn_tokens(smoke_tok, "max")
    call = encode(smoke_tok, "call")
    assert action_ids(turn, [turn.think_id, *encode(smoke_tok, "3 + 4 = 7"), turn.think_end_id, *call]) == call
    assert action_ids(turn, [*call, turn.think_id, *encode(smoke_tok, "unclosed")]) == call
    assert action_ids(turn, [*call, turn.stop_id]) == call
    # kimi_code's calls hold special ids (its <|tool_call_end|> is one): the env gets them back as text.
    from envs.experts import demonstration
    action = demonstration("echo_word", "kimi_code", 2)["steps"][0]["action"]
    ids = encode(smoke_tok, action)
    assert min(ids) < turn.n_special and sft_format(smoke_tok, "low").decode(ids) == action


def _episode(reward: float, errors: list, n_tokens: int, stop: str) -> Episode:
    ep = Episode(reward=reward, stop_reason=stop)
    ep.turns = [PolicyTurn(0, [1] * n_tokens, [0.0] * n_tokens, [0.0] * n_tokens, "stop", "", e) for e in errors]
    return ep


def test_summary_counts_by_task_family_and_harness():
    tasks = [envs.generate("arith_word", 0), envs.generate("slack_post", 0)]
    no_call = "no tool call found. Call a tool …"
    played = [(0, "codex", _episode(1.0, [None], 4, "terminated")),
              (0, "codex", _episode(0.0, [no_call, no_call, None], 2, "budget")),  # last turn never stepped
              (1, "hermes", _episode(0.0, [None, "the token budget (5) is spent"], 3, "truncated"))]
    r = summarize(tasks, played, "low", samples=2, temperature=1.0, seconds=2.0)
    assert (r.n, r.successes, r.success_rate) == (3, 1, pytest.approx(1 / 3))
    assert r.per_task == {"arith_word/0": 1, "slack_post/0": 0}
    assert r.per_family == {"arith_word": (1, 2), "slack_post": (0, 1)}
    assert r.per_domain == {"general_tasks": (1, 2), "general_agents": (0, 1)}
    # codex: 2 of 3 stepped turns unparseable; hermes: a spent budget is not an unreadable call.
    assert r.per_harness["codex"] == {"success_rate": 0.5, "n": 2, "unparseable_rate": pytest.approx(2 / 3)}
    assert r.per_harness["hermes"]["unparseable_rate"] == 0.0
    assert r.unparseable_rate == pytest.approx(2 / 5)
    assert r.mean_policy_tokens == pytest.approx((4 + 6 + 6) / 3) and r.policy_tokens_per_s == 8.0
    meta = r.as_metadata("eval/")
    assert meta["eval/n"] == 3 and meta["eval/ci95_low"] < 1 / 3 < meta["eval/ci95_high"]
    assert meta["eval/family/slack_post/success_rate"] == 0.0 and meta["eval/stop/budget"] == 1
    assert meta["eval/pass_at_2"] == 0.5  # arith_word solved by one of its 2 episodes, slack_post by none


def test_evaluate_plays_every_sample_and_is_reproducible(model, smoke_tok):
    tasks = [envs.generate("arith_word", s) for s in range(3)]
    kw = dict(samples=2, temperature=1.0, seed=3, specs=SPECS, max_episodes_per_batch=4)
    a = evaluate(model, smoke_tok, tasks, "high", **kw)
    b = evaluate(model, smoke_tok, tasks, "high", **kw)
    assert isinstance(a, EvalReport) and a.n == 6 and sum(a.per_task.values()) == a.successes
    assert a.as_metadata() == {**b.as_metadata(), "seconds": a.seconds, "policy_tokens_per_s": a.policy_tokens_per_s}
    assert sum(a.stop_reasons.values()) == 6 and a.mean_policy_tokens <= 12
    # None: the four training harnesses round-robin, never the held-out openclaw.
    assert set(a.per_harness) == {"kimi_code", "claude_code", "codex"}
    assert set(evaluate(model, smoke_tok, tasks[:1], "low", harness="openclaw", specs=SPECS).per_harness) == {"openclaw"}


@pytest.mark.parametrize("kwargs, match", [(dict(effort="medium"), "unknown effort"),
                                           (dict(samples=2), "temperature"),
                                           (dict(harness="bash"), "unknown harness")])
def test_bad_arguments_say_what_to_change(model, smoke_tok, kwargs, match):
    args = {"effort": "low", **kwargs}
    with pytest.raises(ValueError, match=match):
        evaluate(model, smoke_tok, [envs.generate("arith_word", 0)], args.pop("effort"), specs=SPECS, **args)


def test_samples_of_one_task_share_a_prefill_and_get_what_they_get_alone(model, smoke_tok):
    task = envs.generate("arith_word", 1)
    fmt, cfg = sft_format(smoke_tok, "low"), SamplingConfig(max_new_tokens=5)
    together = play_tasks(model, fmt, [task], ["codex"], cfg, samples=3, episode_budget=10)
    [(_, _, alone)] = play_tasks(model, fmt, [task], ["codex"], cfg, episode_budget=10)
    for _, _, ep in together:
        assert ep.token_ids == alone.token_ids and ep.model_logprobs == alone.model_logprobs
