"""The env protocol: reset/step contract, budgets, trajectory records, outside policies."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.actions import AppCall, Finish, Read
from envs.experts import baseline_policy, expert_policy, random_policy
from envs.rollout import TranscriptPolicy, rollout


def test_public_surface():
    assert envs.HARNESSES == ("kimi_code", "claude_code", "codex", "openclaw", "hermes")
    assert "fix_bug" in envs.list_envs() and "fix_bug" in envs.list_envs(domain="coding_agents")
    with pytest.raises(ValueError, match="list_envs"):
        envs.make_env("no_such_env")
    with pytest.raises(ValueError, match="harness"):
        envs.make_env("fix_bug", harness="vim")


def test_reset_and_step_contract():
    env = envs.make_env("gmail_reply_notion", harness="kimi_code", seed=0)
    with pytest.raises(RuntimeError):
        env.step("hello")
    obs = env.reset(seed=5)
    assert isinstance(obs, str) and env.task.instruction in obs and "(task id: gmail_reply_notion/5)" in obs
    assert "GmailSend" in obs and "NotionGetPage" in obs and "TaskDone" in obs
    policy = expert_policy("gmail_reply_notion", "kimi_code")
    rewards = []
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs))
        rewards.append(reward)
        assert isinstance(obs, str) and set(info) >= {"step", "calls", "usage", "error"}
        if terminated or truncated:
            break
    assert terminated and not truncated and rewards[-1] == 1.0 and set(rewards[:-1]) == {0.0}
    assert info["verifier"]["success"] is True
    with pytest.raises(RuntimeError):
        env.step("again")
    env.close()


def test_reset_draws_seeded_tasks():
    a, b = envs.make_env("arith_word", seed=7), envs.make_env("arith_word", seed=7)
    seq_a = [a.reset() for _ in range(3)]
    assert seq_a == [b.reset() for _ in range(3)] and len(set(seq_a)) == 3
    with pytest.raises(ValueError, match="make_env"):
        a.reset(task=envs.generate("fix_bug", 0))


def test_error_observations_are_in_harness_style():
    with envs.make_env("file_lookup", harness="claude_code") as env:
        env.reset(seed=0)
        obs, reward, term, trunc, info = env.step("I think the answer is 4")
        assert info["error"].startswith("no tool call") and not term and reward == 0
        assert json.loads(obs)[0]["type"] == "text"
        obs, *_ , info = env.step(env.harness.render_calls([Read("../etc/passwd")]))
        (block,) = json.loads(obs)
        assert block["is_error"] and "inside the workspace" in block["content"]
        assert info["calls"][0]["ok"] is False


@settings(max_examples=40, deadline=None)
@given(text=st.one_of(st.text(max_size=300), st.sampled_from([
    '<tool_call>{"name": "read_file", "arguments": {"path": "/etc/passwd"}}</tool_call>',
    '<tool_call>{"name": "write_file", "arguments": {"path": "../../x", "content": 1}}</tool_call>',
    '<tool_call>{"name": "read_file", "arguments": {"path": "inventory.csv", "offset": -3}}</tool_call>',
    '<tool_call>{"name": "read_file", "arguments": {"path": "\\u0000"}}</tool_call>',
    '<tool_call>{"name": "final_answer", "arguments": {"answer": ["list"]}}</tool_call>',
    '<tool_call>{"name": "patch", "arguments": {"path": "inventory.csv", "old_string": "", "new_string": "x"}}</tool_call>',
    '<tool_call>[1, 2]</tool_call>', '<tool_call>{"name": 3}</tool_call>', "<tool_call>" * 500,
])))
def test_step_never_raises_on_hostile_text(text):
    with envs.make_env("file_lookup", harness="hermes") as env:
        env.reset(seed=1)
        obs, reward, term, trunc, info = env.step(text)
        assert isinstance(obs, str) and reward in (0.0, 1.0)


def test_step_and_token_budgets_truncate():
    with envs.make_env("slack_post", harness="codex", max_steps=3) as env:
        env.reset(seed=0)
        read = env.harness.render_calls([AppCall("slack", "list_channels", {})])
        outs = [env.step(read) for _ in range(3)]
        assert [o[3] for o in outs] == [False, False, True] and outs[-1][1] == 0.0
        assert "not_finished" in outs[-1][4]["verifier"]["details"]
    with envs.make_env("slack_post", harness="codex", max_tokens=30) as env:
        env.reset(seed=0)
        obs, reward, term, trunc, info = env.step(env.harness.render_calls([Finish("x" * 10)]) + " word" * 40)
        assert trunc and not term and reward == 0.0 and "token budget" in info["error"]
    # A tokenizer of the caller's choice counts the budget.
    with envs.make_env("slack_post", max_tokens=100, token_counter=lambda s: len(s.encode())) as env:
        env.reset(seed=0)
        assert env.step("x" * 101)[3] is True


def test_trajectory_record_is_complete_json():
    with envs.make_env("fix_bug", harness="openclaw") as env:
        rec = rollout(env, expert_policy("fix_bug", "openclaw"), seed=3)
    again = json.loads(json.dumps(rec))
    assert again == rec
    assert rec["format"] == "k3-envs-trajectory/1"
    assert {rec["domain"], rec["difficulty"], rec["harness"]} == {"coding_agents", "easy", "openclaw"}
    assert rec["reward"] == 1.0 and rec["verifier"]["success"] and rec["usage"]["steps"] == len(rec["steps"])
    for step in rec["steps"]:
        assert {"action", "calls", "observation", "reward", "tokens"} <= set(step)
    assert rec["steps"][2]["calls"][0]["action"]["kind"] == "edit"


def test_baseline_and_random_policies_are_weaker():
    wins = {"expert": 0, "baseline": 0, "random": 0}
    for seed in range(6):
        for name, pol in [("expert", expert_policy("canvas_submit_drafts", "hermes")),
                          ("baseline", baseline_policy("canvas_submit_drafts", "hermes", slip=0.3, seed=seed)),
                          ("random", random_policy("hermes", seed=seed))]:
            with envs.make_env("canvas_submit_drafts") as env:
                wins[name] += rollout(env, pol, seed=seed)["reward"]
    assert wins["expert"] == 6 and wins["random"] == 0 and wins["baseline"] < 6


def test_an_outside_text_policy_plugs_in():
    """The docs/envs.md example: any generate(prompt) -> text function is a policy."""
    prompts = []

    def my_model(prompt: str) -> str:
        prompts.append(prompt)
        if len(prompts) == 1:
            m = re.search(r'Post this message in the #(\S+) Slack channel: "(.*)"', prompt)
            call = {"name": "slack_post", "arguments": {"channel": m.group(1), "text": m.group(2)}}
            return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        return '<tool_call>\n{"name": "final_answer", "arguments": {}}\n</tool_call>'

    with envs.make_env("slack_post", harness="hermes") as env:
        rec = rollout(env, TranscriptPolicy(my_model), seed=9)
    assert rec["reward"] == 1.0
    # The second prompt holds the whole episode so far: the first prompt, the call, its result.
    assert prompts[1].startswith(prompts[0]) and "<tool_response>" in prompts[1]


def test_every_harness_runs_the_same_task():
    records, worlds = {}, set()
    for h in envs.HARNESSES:
        with envs.make_env("slack_todos_to_notion", harness=h) as env:
            records[h] = rollout(env, expert_policy("slack_todos_to_notion", h), seed=2)
            worlds.add(env.world.digest())
    assert all(r["reward"] == 1.0 for r in records.values())
    # Five syntaxes, one abstract episode: the same final world, different texts.
    assert len(worlds) == 1
    assert len({r["steps"][0]["action"] for r in records.values()}) == 5


def test_task_sets_and_harness_split():
    tasks = envs.task_set("coding_agents", 12, seed=3, difficulties=("easy",))
    assert {t.family for t in tasks} == {"write_function", "fix_bug", "write_constant", "write_answer", "write_number"}
    assert all(t.domain == "coding_agents" and t.difficulty == "easy" for t in tasks)
    assert len({t.id for t in tasks}) == 12
    train, held = envs.harness_split("openclaw")
    assert held == "openclaw" and "openclaw" not in train and len(train) == 4
    with pytest.raises(ValueError):
        envs.harness_split("emacs")
    with envs.make_env(tasks[0].family, harness=held) as env:
        assert "(task id: " + tasks[0].id in env.reset(task=tasks[0])
