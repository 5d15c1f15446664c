"""OpenClaw style: XML-like <invoke> tags, lower-case tools, one dispatcher tool per app.

Modeled on OpenClaw's tool set (research/environments.md §3): `read(path, offset, limit)`,
`write(path, content)`, `edit(path, oldText, newText, replaceAll)`, `exec(command, timeout)` in
seconds, `grep(pattern, path)`; relative paths. Like its `process(action=...)` and `browser(action=...)`
tools, each app is one tool whose `action` parameter picks the operation: `gmail(action="search", ...)`.

    call:  <function_calls>
           <invoke name="read">
           <parameter name="path">src/a.py</parameter>
           </invoke>
           </function_calls>
    observation: <tool_result name="read" status="ok">
                 x = 1
                 </tool_result>

Parameter values are text: numbers, booleans and JSON arrays/objects are converted by the tool's
declared types. Rendered values escape &, < and > as XML entities, and parsed values are unescaped,
so any content round-trips; raw values without entities parse as written.
"""

from __future__ import annotations

import html
import json
import re

from envs.actions import Action, AppCall
from envs.harnesses.base import (
    DESCRIBE, MAX_CALLS, Arg, Call, CallError, Harness, Outcome, ToolDef, ToolSet, coerce, tool_def,
)

# The rest of an opening tag after "<invoke" / "<parameter": ` name="NAME">`, matched at one position
# with a bounded name, so a hostile header costs at most a few hundred steps.
HEADER_RE = re.compile(r"\s{1,64}name=\"([^\"]{0,256})\"\s{0,64}>")
MAX_PARAMS = 64


def _elements(text: str, tag: str, limit: int):
    """(name, body) of every `<tag name="NAME">body</tag>`, left to right, in linear time: an opening
    tag whose header does not match is skipped after a bounded look, the closing tag is looked for
    once per matched header, and a header without a closing tag ends the scan."""
    open_tag, close_tag = f"<{tag}", f"</{tag}>"
    pos, n = 0, 0
    while n <= limit:
        start = text.find(open_tag, pos)
        if start < 0:
            return
        m = HEADER_RE.match(text, start + len(open_tag))
        if m is None:
            pos = start + 1
            continue
        end = text.find(close_tag, m.end())
        if end < 0:
            return
        yield m.group(1), text[m.end():end]
        n += 1
        pos = end + len(close_tag)


def _escape(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        value = json.dumps(value, ensure_ascii=False)
    return html.escape(str(value), quote=False)


class OpenClaw(Harness):
    name = "openclaw"
    title = "OpenClaw"
    absolute_paths = False
    intro = "You are a personal agent running inside OpenClaw. Use tools to get the task done."
    TOOLS = {
        "read": tool_def("read", "read", DESCRIBE["read"],
                         ("path", "path", "string", "Relative path", True),
                         ("offset", "offset", "integer", "First line (1-based)"),
                         ("limit", "limit", "integer", "Number of lines")),
        "write": tool_def("write", "write", DESCRIBE["write"],
                          ("path", "path", "string", "Relative path", True),
                          ("content", "content", "string", "File content", True)),
        "edit": tool_def("edit", "edit", DESCRIBE["edit"],
                         ("path", "path", "string", "Relative path", True),
                         ("oldText", "old", "string", "Exact text to replace", True),
                         ("newText", "new", "string", "Replacement", True),
                         ("replaceAll", "replace_all", "boolean", "Replace every occurrence")),
        "run": tool_def("exec", "run", DESCRIBE["run"],
                        ("command", "command", "string", "Shell command", True),
                        ("timeout", "timeout", "integer", "Timeout in seconds")),
        "search": tool_def("grep", "search", DESCRIBE["search"],
                           ("pattern", "pattern", "string", "Extended regular expression", True),
                           ("path", "path", "string", "File or directory (default: .)")),
        "finish": tool_def("done", "finish", DESCRIBE["finish"],
                           ("answer", "answer", "string", "The answer, if one is asked for")),
    }

    def app_tool_name(self, app: str, tool: str) -> str:
        return app

    def call_id(self, index: int, tool: str) -> str:
        return f"{tool}#{index + 1}"

    def app_tool_defs(self, toolset: ToolSet) -> list[ToolDef]:
        out = []
        for app in toolset.apps:
            schemas = {s.name: s for s in toolset.app_schemas() if s.app == app}
            if not schemas:
                continue
            desc = [f"{app} operations, chosen with `action`:"]
            for s in schemas.values():
                params = ", ".join(f"{p.name}{'' if p.required else '?'}: {p.type}" for p in s.params)
                desc.append(f"- {s.name}({params}): {s.description}")
            args = (Arg("action", "action", "string", f"one of {sorted(schemas)}", True),)
            out.append(ToolDef(app, "app", "\n".join(desc), args, app, None))
        return out

    def encode(self, action: Action):
        if isinstance(action, AppCall):
            return action.app, {"action": action.tool, **action.args}
        return super().encode(action)

    def decode(self, tool: str, args, toolset: ToolSet) -> Action:
        tdef = self.lookup(tool, toolset)
        if tdef.kind != "app":
            return super().decode(tool, args, toolset)
        args = dict(args)
        op = args.pop("action", None)
        schemas = {s.name: s for s in toolset.app_schemas() if s.app == tdef.app}
        if op not in schemas:
            raise CallError(f"{tool}: 'action' must be one of {sorted(schemas)}")
        clean = {}
        for k, v in args.items():
            p = schemas[op].param(k)
            clean[k] = coerce(v, p.type, f"{tool}.{op}: argument {k!r}") if p is not None else v
        return AppCall(tdef.app, op, clean)

    def render_system_prompt(self, toolset: ToolSet) -> str:
        finish = self.TOOLS["finish"].name
        lines = [self.intro]
        if toolset.files or toolset.run:
            lines.append("Your workspace is the current directory; paths are relative to it.")
        lines += ["", "<tools>"]
        for d in self.tool_defs(toolset):
            lines.append(f'<tool name="{d.name}">')
            lines.append(d.description)
            for a in d.args:
                req = ' required="true"' if a.required else ""
                lines.append(f'<parameter name="{a.name}" type="{a.type}"{req}>{a.description}</parameter>')
            lines.append("</tool>")
        lines += [
            "</tools>",
            "",
            "Call tools like this (several <invoke> blocks may go in one <function_calls>):",
            '<function_calls>\n<invoke name="TOOL">\n<parameter name="NAME">value</parameter>\n</invoke>\n</function_calls>',
            f"Call {finish} when the task is finished.",
        ]
        return "\n".join(lines)

    def render_calls(self, actions: list[Action], start_index: int = 0) -> str:
        out = ["<function_calls>"]
        for a in actions:
            name, args = self.encode(a)
            out.append(f'<invoke name="{name}">')
            for k, v in args.items():
                out.append(f'<parameter name="{k}">{_escape(v)}</parameter>')
            out.append("</invoke>")
        out.append("</function_calls>")
        return "\n".join(out)

    def parse_calls(self, text: str, toolset: ToolSet, start_index: int) -> list[Call]:
        calls: list[Call] = []
        for name, body in _elements(text, "invoke", 4 * MAX_CALLS):
            if len(calls) == MAX_CALLS:
                calls.append(Call("", "", None, f"at most {MAX_CALLS} tool calls per turn"))
                break
            cid = self.call_id(start_index + len(calls), name)
            try:
                args = {}
                for key, value in _elements(body, "parameter", MAX_PARAMS):
                    if key in args:
                        raise CallError(f"{name}: parameter {key!r} is given twice")
                    if len(args) == MAX_PARAMS:
                        raise CallError(f"{name}: more than {MAX_PARAMS} parameters")
                    args[key] = html.unescape(value)
                calls.append(Call(cid, name, self.decode(name, args, toolset)))
            except CallError as e:
                calls.append(Call(cid, name, None, str(e)))
        return calls

    def result_text(self, o: Outcome) -> str:
        if o.ok and o.run is not None:
            r = o.run
            tail = f"(exit code {r.exit_code}" + ("" if r.status == "exited" else f", {r.status.replace('_', ' ')}") + ")"
            return f"{r.output}{tail}"
        return self.plain_result(o, "raw")

    def render_results(self, outcomes: list[Outcome]) -> str:
        return "\n".join(
            f'<tool_result name="{o.call.tool}" status="{"ok" if o.ok else "error"}">\n'
            f"{self.result_text(o)}\n</tool_result>"
            for o in outcomes
        )

    def render_parse_error(self, message: str) -> str:
        return f'<tool_result status="error">\n{message}\n</tool_result>'
