"""Kimi Code style: Kimi K2 tool-call tokens, kimi-cli tool names, ToolOk / ToolError results.

Modeled on kimi-cli's default agent (research/environments.md §3): `ReadFile(path, line_offset,
n_lines)`, `WriteFile(path, content)`, `StrReplaceFile(path, edit={old, new, replace_all})`,
`Shell(command, timeout)` in seconds, `Grep(pattern, path)`; absolute paths under /workspace; app tools
in the same CamelCase (`GmailSearch`, `ClockAdvanceDay`). Calls use the K2 special tokens; results
are headed with the call id, errors are wrapped in <system> tags.

    call:  <|tool_calls_section_begin|><|tool_call_begin|>functions.ReadFile:0<|tool_call_argument_begin|>
           {"path": "/workspace/a.py"}<|tool_call_end|><|tool_calls_section_end|>
    observation:
           ## Return of functions.ReadFile:0
           <system>1 lines read from file starting from line 1.</system>
                1\tx = 1

In rendered arguments every "<" is written as the JSON escape \\u003c, so file contents that contain
the special tokens cannot end a call early; the parser accepts both forms.
"""

from __future__ import annotations

import json

from envs.actions import Action
from envs.harnesses.base import (
    DESCRIBE, MAX_CALLS, Call, CallError, Harness, Outcome, ToolSet, dumps, tagged_blocks, tool_def,
)

BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN = "<|tool_call_begin|>", "<|tool_call_argument_begin|>"


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


class KimiCode(Harness):
    name = "kimi_code"
    title = "Kimi Code"
    absolute_paths = True
    intro = "You are Kimi Code, a command-line agent. Solve the task with the tools provided."
    TOOLS = {
        "read": tool_def("ReadFile", "read", DESCRIBE["read"],
                         ("path", "path", "string", "Absolute path", True),
                         ("line_offset", "offset", "integer", "First line to read (1-based)"),
                         ("n_lines", "limit", "integer", "Number of lines")),
        "write": tool_def("WriteFile", "write", DESCRIBE["write"],
                          ("path", "path", "string", "Absolute path", True),
                          ("content", "content", "string", "File content", True)),
        "edit": tool_def(
            "StrReplaceFile", "edit", DESCRIBE["edit"],
            ("path", "path", "string", "Absolute path", True),
            ("old", "old", "string", "", True),
            ("new", "new", "string", "", True),
            ("replace_all", "replace_all", "boolean", ""),
            shown={"path": {"type": "string", "description": "Absolute path"},
                   "edit": {"type": "object", "description": "The edit",
                            "properties": {"old": {"type": "string"}, "new": {"type": "string"},
                                           "replace_all": {"type": "boolean"}},
                            "required": ["old", "new"]}},
        ),
        "run": tool_def("Shell", "run", DESCRIBE["run"],
                        ("command", "command", "string", "Shell command", True),
                        ("timeout", "timeout", "integer", "Timeout in seconds")),
        "search": tool_def("Grep", "search", DESCRIBE["search"],
                           ("pattern", "pattern", "string", "Extended regular expression", True),
                           ("path", "path", "string", "File or directory (default: the work dir)")),
        "finish": tool_def("TaskDone", "finish", DESCRIBE["finish"],
                           ("result", "answer", "string", "The answer, if one is asked for")),
    }

    def app_tool_name(self, app: str, tool: str) -> str:
        return _camel(app) + _camel(tool)

    def call_id(self, index: int, tool: str) -> str:
        return f"functions.{tool}:{index}"

    def encode_hook(self, kind, args):
        if kind == "edit":
            edit = {"old": args.pop("old"), "new": args.pop("new")}
            if "replace_all" in args:
                edit["replace_all"] = args.pop("replace_all")
            args["edit"] = edit
        return args

    def decode_hook(self, kind, args):
        if kind == "edit":
            if "edit" not in args:
                raise CallError("StrReplaceFile: argument 'edit' ({old, new}) is required")
            edit = args.pop("edit")
            if isinstance(edit, list) and len(edit) == 1:
                edit = edit[0]
            if not isinstance(edit, dict) or set(edit) - {"old", "new", "replace_all"}:
                raise CallError("StrReplaceFile: 'edit' must be an object with keys old, new and optional replace_all")
            args.update(edit)
        return args

    def render_system_prompt(self, toolset: ToolSet) -> str:
        tools = [{"type": "function", "function": t} for t in self.tools_json(toolset)]
        finish = self.TOOLS["finish"].name
        lines = [self.intro]
        if toolset.files or toolset.run:
            lines.append("The working directory is /workspace; always use absolute paths.")
        lines += [
            "",
            "# Tools",
            json.dumps(tools, ensure_ascii=False),
            "",
            "Call tools with the tool-call tokens:",
            f"{BEGIN}<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>"
            "{JSON arguments}<|tool_call_end|>" + END,
            f"Call {finish} when you are done.",
        ]
        return "\n".join(lines)

    def render_calls(self, actions: list[Action], start_index: int = 0) -> str:
        parts = []
        for i, a in enumerate(actions):
            name, args = self.encode(a)
            body = dumps(args).replace("<", "\\u003c")
            parts.append(f"<|tool_call_begin|>{self.call_id(start_index + i, name)}<|tool_call_argument_begin|>"
                         f"{body}<|tool_call_end|>")
        return BEGIN + "".join(parts) + END

    def parse_calls(self, text: str, toolset: ToolSet, start_index: int) -> list[Call]:
        calls: list[Call] = []
        # A call is BEGIN id ARG_BEGIN json END: cut at END (once per call), then split at the first
        # ARG_BEGIN; a block without one is not a call (the regex this replaces skipped it too).
        for start, end in tagged_blocks(text, CALL_BEGIN, "<|tool_call_end|>", 4 * MAX_CALLS):
            head, sep, body = text[start:end].partition(ARG_BEGIN)
            if not sep:
                continue
            if len(calls) == MAX_CALLS:
                calls.append(Call("", "", None, f"at most {MAX_CALLS} tool calls per turn"))
                break
            cid = head.strip()
            name = cid.removeprefix("functions.").rsplit(":", 1)[0].strip()
            try:
                try:
                    args = json.loads(body)
                except (ValueError, RecursionError):
                    raise CallError(f"{name}: the arguments are not valid JSON") from None
                calls.append(Call(cid, name, self.decode(name, args, toolset)))
            except CallError as e:
                calls.append(Call(cid, name, None, str(e)))
        return calls

    def result_text(self, o: Outcome) -> str:
        if not o.ok:
            return f"<system>ERROR: {o.text}</system>"
        if o.read is not None and not o.read.is_dir:
            r = o.read
            note = f"<system>{len(r.lines)} lines read from file starting from line {r.first_line}.</system>"
            return note + "\n" + self.plain_result(o, "cat")
        if o.run is not None:
            r = o.run
            text = r.output
            if r.status != "exited":
                return f"{text}<system>ERROR: Command stopped: {r.status.replace('_', ' ')}.</system>"
            if r.exit_code != 0:
                return f"{text}<system>ERROR: Command failed with exit code: {r.exit_code}.</system>"
            return text + "<system>Command executed successfully.</system>"
        return self.plain_result(o, "cat")

    def render_results(self, outcomes: list[Outcome]) -> str:
        return "\n\n".join(f"## Return of {o.call.call_id}\n{self.result_text(o)}" for o in outcomes)

    def render_parse_error(self, message: str) -> str:
        return f"<system>ERROR: {message}</system>"
