"""Claude Code style: Anthropic `tool_use` blocks as JSON objects, `tool_result` blocks back.

Modeled on Claude Code's tools (research/environments.md §3): `Read(file_path, offset, limit)` with
`cat -n` numbered output, `Write(file_path, content)`, `Edit(file_path, old_string, new_string,
replace_all)`, `Bash(command, timeout)` with the timeout in milliseconds, `Grep(pattern, path)`;
absolute paths under /workspace; app tools appear as MCP tools `mcp__<app>__<tool>`.

    call:        {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "/workspace/a.py"}}
    observation: [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "     1\\tx = 1", "is_error": false}]
"""

from __future__ import annotations

import json

from envs.actions import Action
from envs.harnesses.base import (
    DESCRIBE, MAX_CALLS, Call, CallError, Harness, Outcome, ToolSet, dumps, iter_json_objects, tool_def,
)


class ClaudeCode(Harness):
    name = "claude_code"
    title = "Claude Code"
    absolute_paths = True
    intro = "You are an interactive agent. Use the tools below to complete the user's task."
    TOOLS = {
        "read": tool_def("Read", "read", DESCRIBE["read"],
                         ("file_path", "path", "string", "Absolute path of the file", True),
                         ("offset", "offset", "integer", "Line number to start reading from"),
                         ("limit", "limit", "integer", "Number of lines to read")),
        "write": tool_def("Write", "write", DESCRIBE["write"],
                          ("file_path", "path", "string", "Absolute path of the file", True),
                          ("content", "content", "string", "The full file content", True)),
        "edit": tool_def("Edit", "edit", DESCRIBE["edit"],
                         ("file_path", "path", "string", "Absolute path of the file", True),
                         ("old_string", "old", "string", "Exact text to replace", True),
                         ("new_string", "new", "string", "Replacement text", True),
                         ("replace_all", "replace_all", "boolean", "Replace every occurrence")),
        "run": tool_def("Bash", "run", DESCRIBE["run"],
                        ("command", "command", "string", "The command to run", True),
                        ("timeout", "timeout", "integer", "Timeout in milliseconds")),
        "search": tool_def("Grep", "search", DESCRIBE["search"],
                           ("pattern", "pattern", "string", "Extended regular expression", True),
                           ("path", "path", "string", "File or directory to search (default: /workspace)")),
        "finish": tool_def("TaskComplete", "finish", DESCRIBE["finish"],
                           ("result", "answer", "string", "The answer, if the task asks for one")),
    }

    def app_tool_name(self, app: str, tool: str) -> str:
        return f"mcp__{app}__{tool}"

    def call_id(self, index: int, tool: str) -> str:
        return f"toolu_{index + 1:02d}"

    def encode_hook(self, kind, args):
        if kind == "run" and "timeout" in args:
            args["timeout"] = args["timeout"] * 1000
        return args

    def decode_hook(self, kind, args):
        t = args.get("timeout")
        if kind == "run" and isinstance(t, int) and not isinstance(t, bool):
            args["timeout"] = max(1, -(-t // 1000))
        return args

    def render_system_prompt(self, toolset: ToolSet) -> str:
        tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                 for t in self.tools_json(toolset)]
        finish = self.TOOLS["finish"].name
        lines = [self.intro]
        if toolset.files or toolset.run:
            lines.append("Working directory: /workspace. File paths are absolute.")
        lines += [
            "",
            "Tools (JSON schema):",
            json.dumps(tools, ensure_ascii=False, indent=1),
            "",
            "To call tools, write one JSON tool_use object per call, for example:",
            '{"type": "tool_use", "id": "toolu_01", "name": "' + tools[0]["name"] + '", "input": {...}}',
            "Results come back as a JSON list of tool_result blocks.",
            f"When the task is complete, call {finish}.",
        ]
        return "\n".join(lines)

    def render_calls(self, actions: list[Action], start_index: int = 0) -> str:
        out = []
        for i, a in enumerate(actions):
            name, args = self.encode(a)
            out.append(dumps({"type": "tool_use", "id": self.call_id(start_index + i, name),
                              "name": name, "input": args}))
        return "\n".join(out)

    def parse_calls(self, text: str, toolset: ToolSet, start_index: int) -> list[Call]:
        calls: list[Call] = []
        for obj in iter_json_objects(text):
            if obj.get("type", "tool_use") != "tool_use" or "name" not in obj:
                continue
            if len(calls) == MAX_CALLS:
                calls.append(Call("", "", None, f"at most {MAX_CALLS} tool calls per turn"))
                break
            name = obj["name"] if isinstance(obj["name"], str) else repr(obj["name"])
            cid = obj.get("id") if isinstance(obj.get("id"), str) else self.call_id(start_index + len(calls), name)
            try:
                calls.append(Call(cid, name, self.decode(name, obj.get("input", {}), toolset)))
            except CallError as e:
                calls.append(Call(cid, name, None, str(e)))
        return calls

    def result_text(self, o: Outcome) -> str:
        if o.run is not None and o.ok:
            r = o.run
            text = r.output if r.output else "(no output)"
            if r.status != "exited":
                text += f"\n[command stopped: {r.status.replace('_', ' ')}]"
            if r.exit_code != 0:
                text += f"\nExit code {r.exit_code}"
            return text
        return self.plain_result(o, "cat")

    def render_results(self, outcomes: list[Outcome]) -> str:
        blocks = [{"type": "tool_result", "tool_use_id": o.call.call_id, "content": self.result_text(o),
                   "is_error": not o.ok} for o in outcomes]
        return dumps(blocks)

    def render_parse_error(self, message: str) -> str:
        return dumps([{"type": "text", "text": f"Error: {message}"}])
