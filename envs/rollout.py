"""Running a policy in an environment. A policy is any callable text -> text.

    record = rollout(env, policy, seed=3)    # reset, step until the episode ends, return the record

A policy sees each observation (the first one holds the system prompt, tools and task) and returns
its next message. If it has a `reset()` method, `rollout` calls it before the episode. Policies that
need the whole conversation — every language model — can be wrapped in `TranscriptPolicy`, which
keeps the episode's text and hands all of it to a `generate(prompt) -> text` function each turn.
"""

from __future__ import annotations

from typing import Any, Callable

from envs.env import Env
from envs.tasks.base import Task

Policy = Callable[[str], str]


def rollout(env: Env, policy: Policy, task: Task | None = None, seed: int | None = None) -> dict[str, Any]:
    """Play one episode of `policy` in `env`; returns the trajectory record (env.trajectory())."""
    obs = env.reset(task=task, seed=seed)
    reset = getattr(policy, "reset", None)
    if callable(reset):
        reset()
    while True:
        obs, _, terminated, truncated, _ = env.step(policy(obs))
        if terminated or truncated:
            return env.trajectory()


class TranscriptPolicy:
    """A policy from `generate(prompt) -> text`: the prompt is the episode so far, observations and
    the policy's own messages alternating, joined by `separator`, ending with `assistant_prefix`."""

    def __init__(self, generate: Callable[[str], str], separator: str = "\n\n", assistant_prefix: str = ""):
        self.generate = generate
        self.separator = separator
        self.assistant_prefix = assistant_prefix
        self._parts: list[str] = []

    def reset(self) -> None:
        self._parts = []

    def __call__(self, observation: str) -> str:
        self._parts.append(observation)
        text = self.generate(self.separator.join(self._parts) + self.separator + self.assistant_prefix)
        self._parts.append(self.assistant_prefix + text)
        return text
