"""KernelEnv: prompt, scoring of a reply, termination, snapshot/restore."""

from dataclasses import replace

import pytest

from envs.kernelsuite import KernelEnv, extract_submission
from envs.kernelsuite.env import KernelEnvConfig
from envs.kernelsuite.submissions import HACKS, HONEST


def reply(source: str) -> str:
    return f"Here is my kernel.\n\n```python\n{source}```\n"


@pytest.fixture()
def env(fast_config):
    return KernelEnv(KernelEnvConfig(tasks=("relu", "softmax"), max_turns=2, eval=fast_config))


def test_extract_submission_takes_the_last_modelnew_block():
    text = ("```python\nclass ModelNew: a = 1\n```\ntext\n```python\nclass ModelNew: a = 2\n```\n"
            "```python\nprint('usage')\n```")
    assert extract_submission(text).strip() == "class ModelNew: a = 2"
    assert extract_submission("no code here") is None


def test_prompt_shows_the_reference_and_the_rules(env):
    prompt = env.reset(task="softmax", seed=4)
    assert env.state["task"] == "softmax"
    assert "class Model(nn.Module)" in prompt and "ModelNew" in prompt and "try/except" in prompt
    env.reset(seed=1)
    assert env.state["task"] == "softmax"
    env.reset(seed=0)
    assert env.state["task"] == "relu"
    with pytest.raises(ValueError, match="task name"):
        env.reset(task=3)


def test_honest_reply_ends_the_episode_with_a_reward(env):
    env.reset(task="relu", seed=0)
    source = next(h for h in HONEST if h.name == "relu_maximum").source
    obs, reward, terminated, truncated, info = env.step(reply(source))
    assert terminated and not truncated and info["correct"] and reward >= 0.3
    assert "speedup" in obs and env.done
    with pytest.raises(RuntimeError):
        env.step(reply(source))
    record = env.trajectory()
    assert record["task"] == "relu" and record["reward"] == reward and len(record["turns"]) == 1


def test_hack_scores_zero_with_tags(env):
    env.reset(task="relu", seed=0)
    hack = next(h for h in HACKS if h.name == "mutated_inputs")
    obs, reward, terminated, _, info = env.step(reply(hack.source))
    assert reward == 0.0 and terminated and "hack:D3" in info["tags"] and "D3" in obs


def test_feedback_turns_until_the_budget_is_spent(env):
    env.reset(task="relu", seed=0)
    obs, reward, terminated, truncated, info = env.step("I think the answer is relu.")
    assert (reward, terminated, truncated) == (0.0, False, False) and "python" in obs
    wrong = "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    obs, reward, terminated, truncated, _ = env.step(reply(wrong))
    assert reward == 0.0 and not terminated and truncated


def test_restored_episode_scores_like_the_uninterrupted_one(env, fast_config):
    env.reset(task="relu", seed=9)
    env.step("thinking out loud, no code yet")
    blob = env.snapshot()
    source = next(h for h in HACKS if h.name == "output_cache_stale").source
    _, r1, t1, u1, i1 = env.step(reply(source))
    other = KernelEnv(KernelEnvConfig(tasks=("relu", "softmax"), max_turns=2, eval=fast_config))
    assert "Revise" in other.restore(blob)
    _, r2, t2, u2, i2 = other.step(reply(source))
    assert (r1, t1, u1, i1["rules_fired"], i1["correct"]) == (r2, t2, u2, i2["rules_fired"], i2["correct"])
    assert other.snapshot() == env.snapshot()
    with pytest.raises(ValueError):
        other.restore(b'{"version": 0, "state": {}}')
    with pytest.raises(ValueError, match="not a KernelEnv snapshot"):
        other.restore(b"\x1f\x8b garbage")


def test_core_rollout_drives_the_env(fast_config):
    from envs.rollout import rollout

    env = KernelEnv(KernelEnvConfig(tasks=("relu",), eval=fast_config), seed=5)
    source = next(h for h in HONEST if h.name == "relu_maximum").source
    record = rollout(env, lambda obs: reply(source))
    assert record["done"] and record["turns"][0]["correct"] and record["reward"] >= 0.3


def test_config_rejects_unknown_tasks():
    with pytest.raises(ValueError, match="unknown kernel task"):
        KernelEnvConfig(tasks=("nope",))
    with pytest.raises(ValueError):
        KernelEnvConfig(max_turns=0)
    assert replace(KernelEnvConfig(), max_turns=3).max_turns == 3
