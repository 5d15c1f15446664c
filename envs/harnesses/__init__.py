"""Five harness styles of one abstract action space (research/environments.md §3).

| name        | call syntax                                   | file tools                                  |
|-------------|-----------------------------------------------|---------------------------------------------|
| kimi_code   | K2 tokens `<|tool_call_begin|>functions.X:i…` | ReadFile, WriteFile, StrReplaceFile, Shell  |
| claude_code | JSON `tool_use` objects                       | Read, Write, Edit, Bash, Grep               |
| codex       | Responses `function_call` items, apply_patch  | read_file, apply_patch, shell, grep_files   |
| openclaw    | XML-like `<invoke>` / `<parameter>` tags      | read, write, edit, exec, grep               |
| hermes      | JSON inside `<tool_call>` blocks              | read_file, write_file, patch, terminal      |
"""

from __future__ import annotations

from envs.harnesses.base import Call, Harness, Outcome, ToolSet
from envs.harnesses.claude_code import ClaudeCode
from envs.harnesses.codex import Codex
from envs.harnesses.hermes import Hermes
from envs.harnesses.kimi_code import KimiCode
from envs.harnesses.openclaw import OpenClaw

_CLASSES = {cls.name: cls for cls in (KimiCode, ClaudeCode, Codex, OpenClaw, Hermes)}
HARNESSES: tuple[str, ...] = tuple(_CLASSES)


def get_harness(name: str) -> Harness:
    """The harness called `name` (one of HARNESSES)."""
    if name not in _CLASSES:
        raise ValueError(f"unknown harness {name!r}; choose one of {list(HARNESSES)}")
    return _CLASSES[name]()


__all__ = ["HARNESSES", "Call", "Harness", "Outcome", "ToolSet", "get_harness"]
