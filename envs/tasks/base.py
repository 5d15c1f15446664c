"""Tasks and task families: start state, goal, tools, budget and verifier (research/environments.md §6).

A `Family` is a seeded generator of `Task`s of one kind and difficulty:

    generate(seed)     -> Task: instruction, tools offered, budget, and a JSON `spec` with everything
                          needed to rebuild the start state and to verify (hidden tests included)
    initial_files(task) / initial_world(task) -> the start state (workspace files, app world)
    solution(task)     -> the gold action list a scripted expert follows
    verify(task, final) -> Verdict: goal predicates, collateral-damage check, hack flags

Generation is deterministic: the same (family, seed) gives the same Task, byte for byte, which is
what lets a snapshot name its task and a fresh process rebuild it.

Rewards follow tau2's outcome hygiene: 1.0 only when every goal holds, nothing outside the intended
change was touched and no hack flag fired; otherwise 0.0. An episode cut off by its budget scores 0.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

from envs.actions import Action
from envs.apps import World, diff
from envs.harnesses.base import ToolSet
from envs.sandbox import Sandbox, SandboxError

DOMAINS = ("general_tasks", "general_agents", "coding_agents")
DIFFICULTIES = ("easy", "medium", "hard", "marathon")


@dataclass(frozen=True)
class Task:
    family: str
    seed: int
    domain: str
    difficulty: str
    instruction: str
    toolset: ToolSet
    max_steps: int
    max_tokens: int
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.family}/{self.seed}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        ts = self.toolset
        d["toolset"] = {"files": ts.files, "run": ts.run, "apps": list(ts.apps), "only": list(ts.only)}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Task:
        ts = d["toolset"]
        return cls(**{**d, "toolset": ToolSet(ts["files"], ts["run"], tuple(ts["apps"]), tuple(ts["only"]))})


@dataclass
class Final:
    """What the verifier sees after an episode."""

    sandbox: Sandbox
    world: World | None
    answer: str | None  # the Finish answer; None when the episode did not finish
    finished: bool


@dataclass
class Verdict:
    success: bool
    reward: float
    goals: dict[str, bool] = field(default_factory=dict)
    unexpected_changes: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))


def verdict(goals: dict[str, bool], unexpected: list[str], flags: list[str], finished: bool,
            details: dict[str, Any] | None = None) -> Verdict:
    ok = finished and all(goals.values()) and not unexpected and not flags
    details = dict(details or {})
    if not finished:
        details["not_finished"] = "the episode ended without the finish tool (budget spent): reward 0"
    return Verdict(ok, 1.0 if ok else 0.0, goals, unexpected, flags, details)


def normalize_answer(text: str | None) -> str:
    t = (text or "").strip().lower().rstrip(".").strip()
    for ch in "$,":
        t = t.replace(ch, "")
    try:
        x = float(t)
        return str(int(x)) if x.is_integer() else repr(x)
    except ValueError:
        return " ".join(t.split())


class Family(ABC):
    name: str = ""
    domain: str = ""
    difficulty: str = ""
    description: str = ""

    @abstractmethod
    def generate(self, seed: int) -> Task:
        """The task of this family for `seed` (deterministic)."""

    def initial_files(self, task: Task) -> dict[str, str]:
        return dict(task.spec.get("files", {}))

    def initial_world(self, task: Task) -> World | None:
        w = task.spec.get("world")
        return World.from_json(w) if w is not None else None

    @abstractmethod
    def solution(self, task: Task) -> list[Action]:
        """The gold actions, ending with Finish."""

    @abstractmethod
    def verify(self, task: Task, final: Final) -> Verdict:
        """Goal predicates, collateral check and hack flags on the final state."""

    def info(self) -> dict[str, str]:
        return {"name": self.name, "domain": self.domain, "difficulty": self.difficulty,
                "description": self.description}


class WorldFamily(Family):
    """A family over the app world: goals on the final world plus a record-level diff check."""

    @abstractmethod
    def goals(self, task: Task, world: World, answer: str | None) -> dict[str, bool]:
        """Named goal predicates on the final world (and answer)."""

    def allowed(self, task: Task, change) -> bool:
        """Whether one record change (envs.apps.Change) is part of the intended work."""
        return False

    def reference_world(self, task: Task, day: int) -> World:
        """The start world advanced to `day` with no agent actions."""
        ref = self.initial_world(task)
        while ref.day < day:
            ref.advance_day()
        return ref

    def verify(self, task: Task, final: Final) -> Verdict:
        world = final.world
        reference = self.reference_world(task, world.day)
        changes = diff(reference, world)
        unexpected = [f"{c.op} {c.key} ({', '.join(c.fields)})" for c in changes if not self.allowed(task, c)]
        unexpected += files_changed(final.sandbox, self.initial_files(task))
        goals = self.goals(task, world, final.answer)
        return verdict(goals, unexpected, [], final.finished, {"changes": len(changes), "day": world.day})


def files_changed(sandbox: Sandbox, files: dict[str, str]) -> list[str]:
    """Problems if the workspace differs from `files` (added, removed or edited files)."""
    present = {k for k, v in sandbox.manifest().items() if v["type"] != "dir"}
    out = [f"file added: {p}" for p in sorted(present - set(files))]
    out += [f"file removed: {p}" for p in sorted(set(files) - present)]
    for p in sorted(set(files) & present):
        try:
            if sandbox.read_text(p) != files[p]:
                out.append(f"file changed: {p}")
        except SandboxError:
            out.append(f"file unreadable: {p}")
    return out
