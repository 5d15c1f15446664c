"""RL environments behind one text-in/text-out protocol (DESIGN.md §4, §8; docs/envs.md).

    import envs
    envs.list_envs()                       # task family names, e.g. "fix_bug", "assistant_term"
    envs.HARNESSES                         # ("kimi_code", "claude_code", "codex", "openclaw", "hermes")
    env = envs.make_env("gmail_label", harness="codex", seed=0)
    obs = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step(policy_text)
    blob = env.snapshot(); env.restore(blob)
    record = envs.rollout(env, policy)     # policy: any callable str -> str

The package depends on the standard library only (no torch, no orchestration stack). The kernel
suite (envs.kernelsuite, which needs torch) is imported only when `make_env("kernelsuite")` asks for it.
"""

from __future__ import annotations

from typing import Callable

from envs.env import Env, EnvConfig, count_tokens
from envs.harnesses import HARNESSES, get_harness
from envs.jail import Limits
from envs.rollout import Policy, TranscriptPolicy, rollout
from envs.tasks import (
    DIFFICULTIES, DOMAINS, Family, Task, family_names, generate, get_family, register_family,
)


KERNEL_SUITE = "kernelsuite"


def list_envs(domain: str | None = None, difficulty: str | None = None) -> list[str]:
    """Task family names accepted by make_env, optionally only one domain and/or difficulty.
    `make_env(KERNEL_SUITE)` also gives the kernel-coding suite (coding_agents domain), which has
    its own tasks and scoring rather than a task family."""
    return family_names(domain, difficulty)


def env_info(name: str) -> dict[str, str]:
    """Name, domain, difficulty and description of one env."""
    return get_family(name).info()


def harness_split(held_out: str) -> tuple[tuple[str, ...], str]:
    """(training harnesses, the held-out one) for transfer tests (DESIGN.md §5 claim 7)."""
    if held_out not in HARNESSES:
        raise ValueError(f"held_out must be one of {HARNESSES}, got {held_out!r}")
    return tuple(h for h in HARNESSES if h != held_out), held_out


def task_set(domain: str, n: int, seed: int = 0, difficulties: tuple[str, ...] | None = None) -> list[Task]:
    """n tasks of one domain, cycling over its families (optionally only some difficulties); task i
    of family f has seed `seed + i`, so two sets with different seeds overlap only if their ranges do."""
    names = [f for f in family_names(domain) if difficulties is None or get_family(f).difficulty in difficulties]
    if not names:
        raise ValueError(f"no family of domain {domain!r} has a difficulty in {difficulties}")
    return [generate(names[i % len(names)], seed + i // len(names)) for i in range(n)]


def make_env(name: str, harness: str = "hermes", seed: int = 0, max_steps: int | None = None,
             max_tokens: int | None = None, limits: Limits = Limits(),
             token_counter: Callable[[str], int] = count_tokens) -> Env:
    """An environment for the task family `name` rendered in `harness` style.

    seed seeds the draw of task seeds when reset() is called without one. max_steps / max_tokens
    replace the task's own budget (tokens of policy text, counted with token_counter)."""
    if name == KERNEL_SUITE:
        # The kernel suite speaks the same protocol; its observations are plain text in every harness.
        from envs.kernelsuite import KernelEnv
        return KernelEnv(seed=seed)
    config = EnvConfig(max_steps=max_steps, max_tokens=max_tokens, limits=limits)
    return Env(get_family(name), get_harness(harness), seed=seed, config=config, count_tokens=token_counter)


__all__ = [
    "DIFFICULTIES", "DOMAINS", "Env", "EnvConfig", "Family", "HARNESSES", "KERNEL_SUITE", "Limits", "Policy", "Task",
    "TranscriptPolicy", "env_info", "generate", "get_harness", "harness_split", "list_envs", "make_env",
    "register_family", "rollout", "task_set",
]
