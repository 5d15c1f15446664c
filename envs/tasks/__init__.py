"""Task families: the registry, and seeded generation of tasks by family name.

Families by domain (difficulty in brackets; tables in each module):
- general_tasks (general.py): arith_word [easy], file_lookup [easy], canvas_due_date [easy],
  file_aggregate [medium]
- general_agents (assistant.py): slack_post [easy], gmail_label [easy], gmail_reply_notion [medium],
  canvas_submit_drafts [medium], slack_todos_to_notion [medium], assistant_3day [medium],
  assistant_2week [hard], assistant_term [marathon]
- coding_agents (coding.py): write_function [easy], fix_bug [easy], fix_bugs_multi [medium],
  implement_stubs [medium], rename_api [hard]
- starter rungs of the RL task ladder (starter.py), one short answer or one call: echo_word,
  compare_numbers (general_tasks), slack_ping (general_agents), write_constant (coding_agents), all easy;
  compare_numbers_close [medium], the hard split of compare_numbers; slack_ping_pick [medium], slack_ping
  with a choice of two words

`register_family` adds an outside family (any `Family` subclass) to the registry.
"""

from __future__ import annotations

from envs.tasks import assistant, coding, general, starter
from envs.tasks.base import DIFFICULTIES, DOMAINS, Family, Final, Task, Verdict

_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    """Add a family under its name; names must be unique."""
    if not family.name or family.domain not in DOMAINS or family.difficulty not in DIFFICULTIES:
        raise ValueError(
            f"a family needs a name, a domain in {DOMAINS} and a difficulty in {DIFFICULTIES}; "
            f"got {family.name!r}, {family.domain!r}, {family.difficulty!r}"
        )
    if family.name in _FAMILIES:
        raise ValueError(f"a family named {family.name!r} is already registered")
    _FAMILIES[family.name] = family


for _f in general.FAMILIES + assistant.FAMILIES + coding.FAMILIES + starter.FAMILIES:
    register_family(_f)


def get_family(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"unknown task family {name!r}; envs.list_envs() lists them")
    return _FAMILIES[name]


def family_names(domain: str | None = None, difficulty: str | None = None) -> list[str]:
    if domain is not None and domain not in DOMAINS:
        raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    return [n for n, f in _FAMILIES.items()
            if (domain is None or f.domain == domain) and (difficulty is None or f.difficulty == difficulty)]


def generate(family: str, seed: int) -> Task:
    """The task of `family` for `seed` (deterministic)."""
    return get_family(family).generate(seed)


__all__ = ["DIFFICULTIES", "DOMAINS", "Family", "Final", "Task", "Verdict", "family_names", "generate",
           "get_family", "register_family"]
