"""The abstract action space every harness renders and parses (research/environments.md §3).

Seven kinds, one frozen dataclass each:

    Read(path, offset, limit)        lines offset .. offset+limit-1 of a file (1-based)
    Write(path, content)             create or overwrite a file
    Edit(path, old, new, replace_all) replace an exact substring (once, or every occurrence)
    Run(command, timeout)            a shell command in the jailed subprocess (timeout in seconds)
    Search(pattern, path)            extended-regex search over the files under path
    AppCall(app, tool, args)         one tool of a mock app (gmail, notion, slack, canvas, clock)
    Finish(answer)                   end the episode; the answer matters only to answer tasks

Paths are relative to the workspace root, with `/` separators. A harness that shows absolute
paths (Claude Code, Kimi Code) adds and strips its own prefix; the sandbox rejects anything that
would leave the root. `to_dict` / `from_dict` give the JSON form used in trajectory records.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Union


@dataclass(frozen=True)
class Read:
    path: str
    offset: int = 1
    limit: int | None = None


@dataclass(frozen=True)
class Write:
    path: str
    content: str


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str
    replace_all: bool = False


@dataclass(frozen=True)
class Run:
    command: str
    timeout: int | None = None


@dataclass(frozen=True)
class Search:
    pattern: str
    path: str = "."


@dataclass(frozen=True)
class AppCall:
    app: str
    tool: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finish:
    answer: str = ""


Action = Union[Read, Write, Edit, Run, Search, AppCall, Finish]

KINDS: dict[str, type] = {
    "read": Read,
    "write": Write,
    "edit": Edit,
    "run": Run,
    "search": Search,
    "app": AppCall,
    "finish": Finish,
}
_KIND_OF = {cls: kind for kind, cls in KINDS.items()}


def kind_of(action: Action) -> str:
    """The kind name ("read", "write", ...) of an action."""
    return _KIND_OF[type(action)]


def to_dict(action: Action) -> dict[str, Any]:
    """JSON form: {"kind": ..., <fields>}."""
    out: dict[str, Any] = {"kind": kind_of(action)}
    for f in fields(action):
        out[f.name] = getattr(action, f.name)
    return out


def from_dict(data: dict[str, Any]) -> Action:
    """Inverse of `to_dict`."""
    if not isinstance(data, dict) or data.get("kind") not in KINDS:
        raise ValueError(f"an action dict needs 'kind' in {sorted(KINDS)}, got {data!r}")
    cls = KINDS[data["kind"]]
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})
