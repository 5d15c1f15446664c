"""Scripted policies: the expert (SFT demonstrations), a weak baseline, and a random policy.

The expert follows its task's gold action list (`Family.solution`, as tau2-bench keeps golden
actions) and writes each action in the harness's own syntax, one call per turn. It is a plain
observation -> text callable: it recognizes a new episode by the harness's first prompt line and
reads the task id ("(task id: family/seed)") from it, regenerates that task — generation is
deterministic — and follows the plan from there. It never reads the environment's state.

The baseline is the same script with slips: before each turn it forgets, with probability `slip`,
the step it was about to take and goes on with the next one. Forgetting a lookup is harmless;
forgetting a change fails the task, so its success falls with the number of changes a task needs —
the graded-difficulty curve the table in docs/envs.md shows.

The random policy writes well-formed calls of random tools with random arguments.

    from envs.experts import expert_policy, demonstration
    policy = expert_policy("fix_bug", "codex")
    record = demonstration("fix_bug", "codex", seed=7)     # a full trajectory record
"""

from __future__ import annotations

import random
from typing import Any

from envs.actions import Action, AppCall, Edit, Finish, Read, Run, Search, Write
from envs.env import TASK_ID_RE
from envs.harnesses import Harness, get_harness
from envs.rollout import rollout
from envs.tasks import get_family
from envs.tasks.base import Task


class _TaskAware:
    """Finds the task of each new episode from its first observation."""

    def __init__(self, harness: str | Harness, family: str | None = None):
        self.harness = get_harness(harness) if isinstance(harness, str) else harness
        self.family = family
        self.task: Task | None = None
        self._calls = 0

    def reset(self) -> None:
        self.task = None
        self._calls = 0

    def _begin(self, observation: str) -> bool:
        """Load the task if `observation` opens an episode; True if it does."""
        if not observation.startswith(self.harness.intro):
            return False
        m = TASK_ID_RE.search(observation)
        if m is None:
            return False
        family, seed = m.group(1), int(m.group(2))
        if self.family is not None and family != self.family:
            raise ValueError(f"this policy is scripted for {self.family!r} but the episode is a {family!r} task")
        self.task = get_family(family).generate(seed)
        self._calls = 0
        self.on_task()
        return True

    def on_task(self) -> None:
        """Called when a new task is loaded."""

    def render(self, action: Action) -> str:
        text = self.harness.render_calls([action], start_index=self._calls)
        self._calls += 1
        return text


class ScriptedPolicy(_TaskAware):
    """The expert when slip == 0; the weak baseline when slip > 0."""

    def __init__(self, harness: str | Harness, family: str | None = None, slip: float = 0.0, seed: int = 0):
        if not 0.0 <= slip < 1.0:
            raise ValueError(f"slip is a probability in [0, 1); got {slip}")
        super().__init__(harness, family)
        self.slip = slip
        self.seed = seed
        self.plan: list[Action] = []
        self._i = 0

    def on_task(self) -> None:
        self.plan = get_family(self.task.family).solution(self.task)
        self._i = 0
        self._rng = random.Random(f"{self.seed}/{self.task.id}")

    def __call__(self, observation: str) -> str:
        if not self._begin(observation) and self.task is None:
            raise ValueError("the first observation of an episode must come from envs (it names the task id)")
        if self._i >= len(self.plan):
            return self.render(Finish())
        if self.slip and self._i < len(self.plan) - 1 and self._rng.random() < self.slip:
            self._i += 1
        action = self.plan[self._i]
        self._i += 1
        return self.render(action)


def expert_policy(family: str | None = None, harness: str = "hermes") -> ScriptedPolicy:
    """The scripted expert: a callable observation -> text in `harness` syntax. With `family` set it
    refuses tasks of other families; with None it plays any family."""
    if family is not None:
        get_family(family)
    return ScriptedPolicy(harness, family)


def baseline_policy(family: str | None = None, harness: str = "hermes", slip: float = 0.15,
                    seed: int = 0) -> ScriptedPolicy:
    """The weak baseline: the expert's script with a `slip` chance per turn of skipping a step."""
    if family is not None:
        get_family(family)
    return ScriptedPolicy(harness, family, slip=slip, seed=seed)


WORDS = ["a", "b.py", "tests", "src", "notes.txt", "x", "..", "/etc/passwd", "data", "README"]


class RandomPolicy(_TaskAware):
    """Well-formed calls of random tools with random arguments; finishes with probability 0.05."""

    def __init__(self, harness: str | Harness, seed: int = 0):
        super().__init__(harness)
        self.seed = seed

    def on_task(self) -> None:
        self._rng = random.Random(f"{self.seed}/{self.task.id}")

    def _value(self, jtype: str) -> Any:
        r = self._rng
        if jtype == "integer":
            return r.randint(0, 5)
        if jtype == "boolean":
            return r.random() < 0.5
        if jtype == "array":
            return [r.choice(WORDS)]
        return r.choice(WORDS + ["m0001", "n0001", "c101", "a001", "general", "hello"])

    def action(self) -> Action:
        r = self._rng
        ts = self.task.toolset
        schemas = sorted(ts.app_schemas(), key=lambda s: (s.app, s.name))
        options = list(ts.kinds()) + ["app"] * (3 if schemas else 0)
        kind = r.choice(options)
        if kind == "finish" or r.random() < 0.05:
            return Finish(r.choice(["", "42", "done"]))
        if kind == "read":
            return Read(r.choice(WORDS))
        if kind == "write":
            return Write(r.choice(WORDS), r.choice(["", "x = 1\n", "hello"]))
        if kind == "edit":
            return Edit(r.choice(WORDS), r.choice(["x", "return"]), r.choice(["y", "pass"]), r.random() < 0.3)
        if kind == "search":
            return Search(r.choice(["def", "x", "TODO", "[a-z]+"]), r.choice([".", "tests", "src"]))
        if kind == "run":
            return Run(r.choice(["ls", "python run_tests.py", "cat *.py", "echo hi"]))
        schema = r.choice(schemas)
        args = {p.name: self._value(p.type) for p in schema.params if p.required or r.random() < 0.3}
        return AppCall(schema.app, schema.name, args)

    def __call__(self, observation: str) -> str:
        if not self._begin(observation) and self.task is None:
            raise ValueError("the first observation of an episode must come from envs (it names the task id)")
        return self.render(self.action())


def random_policy(harness: str = "hermes", seed: int = 0) -> RandomPolicy:
    return RandomPolicy(harness, seed)


def demonstration(family: str, harness: str, seed: int) -> dict[str, Any]:
    """Roll out the expert on (family, seed) in `harness`; returns the trajectory record."""
    from envs import make_env

    with make_env(family, harness=harness) as env:
        return rollout(env, expert_policy(family, harness), seed=seed)

