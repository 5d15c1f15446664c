"""Hostile inputs and attack episodes: what a policy searching for unearned reward would try.

Used by tests/envs/test_envs_adversarial.py (every attack must earn no reward, reach nothing outside
its sandbox and leave the host running) and by benchmarks/envs_sandbox.py (attempts, escapes and
host crashes; the worst parse time per harness).

- `hostile_texts(n_chars)`: policy messages that made earlier parsers quadratic or raise: every
  harness's opening tag repeated without its closing tag, headers without a closing quote, nested
  unclosed JSON, unterminated JSON strings, non-ASCII digits and huge integers as arguments.
- `ATTACKS`: shell commands run as a coding episode's policy, each paired with the host-side check of
  whether it got out (a file outside the sandbox written, a listening port reached, ...).
"""

from __future__ import annotations

# Opening tags and headers of the five call syntaxes, each repeated with no closing tag.
UNCLOSED_UNITS = (
    "<tool_call>",
    '<tool_call>{"name": "terminal", "arguments": {"command": "',
    '<invoke name="read">',
    '<invoke name="',
    '<invoke name="read"><parameter name="path">',
    '<parameter name="a">',
    "<|tool_call_begin|>",
    "<|tool_call_begin|>functions.Shell:0<|tool_call_argument_begin|>",
    '{"a":[',
    '{"a":"',
    '{"type":"tool_use","name":"Read","input":{',
    '{"type": "function_call", "name": "shell", "arguments": "{\\"command\\": [',
    "{",
    "*** Begin Patch\n*** Update File: a\n@@\n-",
)


def hostile_texts(n_chars: int = 200_000) -> dict[str, str]:
    """{label: text} of hostile messages of about n_chars characters each."""
    out = {}
    for unit in UNCLOSED_UNITS:
        out[f"repeat {unit[:40]!r}"] = (unit * (n_chars // len(unit) + 1))[:n_chars]
    depth = 900  # just under Python's recursion limit: every level decodes the whole tail
    nest = '{"a":[' * depth
    out["nested unclosed JSON with a long tail"] = nest + "1," * ((n_chars - len(nest)) // 2)
    return out


def raw_call(harness, tool: str, args: dict) -> str:
    """One call of `tool` with `args` exactly as given (no coercion), in the harness's syntax."""
    import html
    import json

    if harness.name == "hermes":
        return "<tool_call>" + json.dumps({"name": tool, "arguments": args}) + "</tool_call>"
    if harness.name == "kimi_code":
        return f"<|tool_call_begin|>functions.{tool}:0<|tool_call_argument_begin|>{json.dumps(args)}<|tool_call_end|>"
    if harness.name == "claude_code":
        return json.dumps({"type": "tool_use", "id": "toolu_01", "name": tool, "input": args})
    if harness.name == "codex":
        return json.dumps({"type": "function_call", "call_id": "call_1", "name": tool, "arguments": json.dumps(args)})
    params = "".join(f'<parameter name="{k}">{html.escape(str(v), quote=False)}</parameter>' for k, v in args.items())
    return f'<invoke name="{tool}">{params}</invoke>'


BAD_INTEGERS = ("²", "١٢", " 7\u00a0", "1" + "0" * 400, 10**400, -(10**30), float("inf"), 1e300, "0x10")


def bad_number_calls(harness) -> list[str]:
    """Reads and runs whose integer argument is a non-ASCII digit, a huge number or an overflowing float."""
    from envs.actions import Read, Run

    texts = []
    for action in (Read("a.py", 3), Run("true", 3)):
        tool, args = harness.encode(action)
        key = next(k for k, v in args.items() if v in (3, 3000))
        for bad in BAD_INTEGERS:
            texts.append(raw_call(harness, tool, {**args, key: bad}))
    return texts
