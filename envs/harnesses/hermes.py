"""Hermes style: tools inside <tools>, calls as JSON in <tool_call> blocks, JSON results.

Modeled on NousResearch's Hermes function-calling format and hermes-agent's tools
(research/environments.md §3): `read_file(path, offset, limit)` with `n|line` numbering,
`write_file(path, content)`, `patch(path, old_string, new_string, replace_all)`,
`terminal(command, timeout)` in seconds, `search_files(pattern, path)`; relative paths; app tools as
`<app>_<tool>`. Every tool result is a JSON object, as hermes-agent's handlers return JSON strings.

    call:  <tool_call>
           {"name": "read_file", "arguments": {"path": "a.py"}}
           </tool_call>
    observation: <tool_response>
                 {"name": "read_file", "content": {"path": "a.py", "content": "     1|x = 1", "total_lines": 1}}
                 </tool_response>

Rendered arguments write "<" as the JSON escape \\u003c, so contents holding "</tool_call>" cannot end
a call early.
"""

from __future__ import annotations

import json

from envs.actions import Action
from envs.harnesses.base import (
    DESCRIBE, MAX_CALLS, Call, CallError, Harness, Outcome, ToolSet, dumps, numbered, tagged_blocks, tool_def,
)


class Hermes(Harness):
    name = "hermes"
    title = "Hermes"
    absolute_paths = False
    intro = "You are a function calling AI model. You may call one or more functions to assist with the user query."
    TOOLS = {
        "read": tool_def("read_file", "read", DESCRIBE["read"],
                         ("path", "path", "string", "Relative path", True),
                         ("offset", "offset", "integer", "First line (1-based)"),
                         ("limit", "limit", "integer", "Number of lines")),
        "write": tool_def("write_file", "write", DESCRIBE["write"],
                          ("path", "path", "string", "Relative path", True),
                          ("content", "content", "string", "File content", True)),
        "edit": tool_def("patch", "edit", DESCRIBE["edit"],
                         ("path", "path", "string", "Relative path", True),
                         ("old_string", "old", "string", "Exact text to replace", True),
                         ("new_string", "new", "string", "Replacement", True),
                         ("replace_all", "replace_all", "boolean", "Replace every occurrence")),
        "run": tool_def("terminal", "run", DESCRIBE["run"],
                        ("command", "command", "string", "Shell command", True),
                        ("timeout", "timeout", "integer", "Timeout in seconds")),
        "search": tool_def("search_files", "search", DESCRIBE["search"],
                           ("pattern", "pattern", "string", "Extended regular expression", True),
                           ("path", "path", "string", "File or directory (default: .)")),
        "finish": tool_def("final_answer", "finish", DESCRIBE["finish"],
                           ("answer", "answer", "string", "The answer, if one is asked for")),
    }

    def app_tool_name(self, app: str, tool: str) -> str:
        return f"{app}_{tool}"

    def call_id(self, index: int, tool: str) -> str:
        return f"{index}"

    def render_system_prompt(self, toolset: ToolSet) -> str:
        tools = [{"type": "function", "function": t} for t in self.tools_json(toolset)]
        finish = self.TOOLS["finish"].name
        lines = [self.intro + " You are provided with function signatures within <tools></tools> XML tags."]
        if toolset.files or toolset.run:
            lines.append("Paths are relative to the workspace directory.")
        lines += [
            "<tools>",
            json.dumps(tools, ensure_ascii=False),
            "</tools>",
            "For each function call return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:",
            '<tool_call>\n{"name": <function-name>, "arguments": <args-dict>}\n</tool_call>',
            f"When the task is complete, call {finish}.",
        ]
        return "\n".join(lines)

    def render_calls(self, actions: list[Action], start_index: int = 0) -> str:
        out = []
        for a in actions:
            name, args = self.encode(a)
            body = dumps({"name": name, "arguments": args}).replace("<", "\\u003c")
            out.append(f"<tool_call>\n{body}\n</tool_call>")
        return "\n".join(out)

    def parse_calls(self, text: str, toolset: ToolSet, start_index: int) -> list[Call]:
        calls: list[Call] = []
        for start, end in tagged_blocks(text, "<tool_call>", "</tool_call>", MAX_CALLS):
            if len(calls) == MAX_CALLS:
                calls.append(Call("", "", None, f"at most {MAX_CALLS} tool calls per turn"))
                break
            cid = self.call_id(start_index + len(calls), "")
            name = "?"
            try:
                try:
                    obj = json.loads(text[start:end])
                except (ValueError, RecursionError):
                    raise CallError("the <tool_call> body is not valid JSON") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                    raise CallError('a <tool_call> needs {"name": ..., "arguments": {...}}')
                name = obj["name"]
                args = obj.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except (ValueError, RecursionError):
                        raise CallError(f"{name}: 'arguments' is not valid JSON") from None
                calls.append(Call(cid, name, self.decode(name, args, toolset)))
            except CallError as e:
                calls.append(Call(cid, name, None, str(e)))
        return calls

    def result_content(self, o: Outcome) -> dict:
        if not o.ok:
            return {"error": o.text}
        if o.read is not None:
            r = o.read
            if r.is_dir:
                return {"path": o.call.action.path, "entries": r.lines}
            return {"path": o.call.action.path, "content": numbered(r.lines, r.first_line, sep="|"),
                    "total_lines": r.total_lines}
        if o.run is not None:
            return {"output": o.run.output, "exit_code": o.run.exit_code,
                    **({} if o.run.status == "exited" else {"error": o.run.status.replace("_", " ")})}
        if o.data is not None:
            return {"result": o.data}
        return {"success": True, "message": o.text}

    def render_results(self, outcomes: list[Outcome]) -> str:
        return "\n".join(
            f"<tool_response>\n{dumps({'name': o.call.tool, 'content': self.result_content(o)})}\n</tool_response>"
            for o in outcomes
        )

    def render_parse_error(self, message: str) -> str:
        return f"<tool_response>\n{dumps({'name': None, 'content': {'error': message}})}\n</tool_response>"
