"""Codex CLI style: OpenAI Responses items, a `shell` tool taking argv, freeform `apply_patch`.

Modeled on Codex (research/environments.md §3): `shell(command: string[], workdir, timeout_ms)`,
`read_file(path, offset, limit)` with `L<n>: ` numbered lines, `grep_files(pattern, path)`, and file
changes only through `apply_patch`, a custom tool whose input is patch text; relative paths; app tools
as MCP tools `<app>__<tool>`. Function-call arguments are a JSON *string*, as in the Responses API.

    call:  {"type": "function_call", "call_id": "call_1", "name": "shell",
            "arguments": "{\\"command\\": [\\"bash\\", \\"-lc\\", \\"ls\\"]}"}
           {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch",
            "input": "*** Begin Patch\\n*** Update File: a.py\\n@@\\n-x = 1\\n+x = 2\\n*** End Patch"}
    observation: {"type": "function_call_output", "call_id": "call_1", "output": "Exit code: 0\\nOutput:\\n..."}

Patch semantics here: `*** Add File:` writes a file (its `+` lines joined by newlines); each `@@`
hunk of `*** Update File:` is one exact-text replacement, old = its ` ` and `-` lines, new = its ` `
and `+` lines (a hunk headed `@@ replace_all` replaces every occurrence). One patch may hold several
operations; each becomes its own action, with call ids `call_N`, `call_N#2`, ...
`*** Delete File:` and `*** Move to:` are refused.
"""

from __future__ import annotations

import json
import shlex

from envs.actions import Action, Edit, Write, kind_of
from envs.harnesses.base import (
    DESCRIBE, MAX_CALLS, Call, CallError, Harness, Outcome, ToolDef, ToolSet, dumps, iter_json_objects,
    tool_def,
)

PATCH_TOOL = ToolDef(
    "apply_patch", "patch",
    "Create or change files with a patch: '*** Begin Patch', then '*** Add File: PATH' followed by '+' "
    "lines, or '*** Update File: PATH' followed by '@@' hunks of ' ' context, '-' old and '+' new lines, "
    "then '*** End Patch'. Paths are relative to the workspace.",
    (),
)
SHELLS = ("bash", "sh", "/bin/bash", "/bin/sh", "/usr/bin/bash")


def patch_text(action: Edit | Write) -> str:
    if isinstance(action, Write):
        body = [f"*** Add File: {action.path}"] + ["+" + ln for ln in action.content.split("\n")]
    else:
        body = [f"*** Update File: {action.path}", "@@ replace_all" if action.replace_all else "@@"]
        body += ["-" + ln for ln in action.old.split("\n")] + ["+" + ln for ln in action.new.split("\n")]
    return "\n".join(["*** Begin Patch", *body, "*** End Patch"])


def parse_patch(text: str) -> list[Edit | Write]:
    """The actions of a patch; CallError with a readable reason if it is malformed."""
    if not isinstance(text, str):
        raise CallError("apply_patch: the input must be patch text")
    lines = text.split("\n")
    while lines and lines[0].strip() == "":
        lines.pop(0)
    if not lines or lines[0].strip() != "*** Begin Patch":
        raise CallError("apply_patch: the patch must start with '*** Begin Patch'")
    actions: list[Edit | Write] = []
    i, ended = 1, False
    while i < len(lines):
        line = lines[i]
        if line.strip() == "*** End Patch":
            ended = True
            break
        if line.startswith("*** Add File: "):
            path = line[len("*** Add File: "):].strip()
            i += 1
            content = []
            while i < len(lines) and not lines[i].startswith("*** "):
                if not lines[i].startswith("+"):
                    raise CallError(f"apply_patch: every line of an added file starts with '+' (file {path})")
                content.append(lines[i][1:])
                i += 1
            actions.append(Write(path, "\n".join(content)))
            continue
        if line.startswith("*** Update File: "):
            path = line[len("*** Update File: "):].strip()
            i += 1
            hunk: list[str] | None = None
            replace_all = False
            hunks: list[tuple[list[str], bool]] = []
            while i < len(lines) and not lines[i].startswith("*** "):
                ln = lines[i]
                if ln.startswith("@@"):
                    if hunk:
                        hunks.append((hunk, replace_all))
                    hunk, replace_all = [], ln[2:].strip() == "replace_all"
                elif ln[:1] in (" ", "-", "+") or ln == "":
                    if hunk is None:
                        hunk = []
                    hunk.append(ln if ln else " ")
                else:
                    raise CallError(f"apply_patch: hunk lines start with ' ', '-' or '+' (file {path})")
                i += 1
            if hunk:
                hunks.append((hunk, replace_all))
            if not hunks:
                raise CallError(f"apply_patch: '*** Update File: {path}' has no hunk")
            for h, all_ in hunks:
                old = "\n".join(x[1:] for x in h if x[0] in " -")
                new = "\n".join(x[1:] for x in h if x[0] in " +")
                actions.append(Edit(path, old, new, all_))
            continue
        if line.startswith("*** Delete File: ") or line.startswith("*** Move to: "):
            raise CallError("apply_patch: deleting and moving files is not supported here")
        if line.strip() in ("", "*** End of File"):
            i += 1
            continue
        raise CallError(f"apply_patch: unexpected line {line[:80]!r}")
    if not ended:
        raise CallError("apply_patch: the patch must end with '*** End Patch'")
    if not actions:
        raise CallError("apply_patch: the patch changes nothing")
    return actions


class Codex(Harness):
    name = "codex"
    title = "Codex"
    absolute_paths = False
    intro = "You are Codex, a coding agent running in a sandboxed workspace."
    TOOLS = {
        "read": tool_def("read_file", "read", DESCRIBE["read"],
                         ("path", "path", "string", "Path relative to the workspace", True),
                         ("offset", "offset", "integer", "First line (1-based)"),
                         ("limit", "limit", "integer", "Number of lines")),
        "write": PATCH_TOOL,
        "edit": PATCH_TOOL,
        "run": tool_def(
            "shell", "run", DESCRIBE["run"],
            ("command", "command", "string", "", True),
            ("timeout_ms", "timeout", "integer", ""),
            shown={"command": {"type": "array", "items": {"type": "string"},
                               "description": "argv, e.g. [\"bash\", \"-lc\", \"ls\"]"},
                   "workdir": {"type": "string", "description": "Directory to run in"},
                   "timeout_ms": {"type": "integer", "description": "Timeout in milliseconds"}},
        ),
        "search": tool_def("grep_files", "search", DESCRIBE["search"],
                           ("pattern", "pattern", "string", "Extended regular expression", True),
                           ("path", "path", "string", "File or directory (default: .)")),
        "finish": tool_def("task_complete", "finish", DESCRIBE["finish"],
                           ("message", "answer", "string", "The answer, if one is asked for")),
    }

    def app_tool_name(self, app: str, tool: str) -> str:
        return f"{app}__{tool}"

    def call_id(self, index: int, tool: str) -> str:
        return f"call_{index + 1}"

    def tool_defs(self, toolset: ToolSet) -> list[ToolDef]:
        defs = super().tool_defs(toolset)
        return [d for i, d in enumerate(defs) if d is not PATCH_TOOL or PATCH_TOOL not in defs[:i]]

    def encode_hook(self, kind, args):
        if kind == "run":
            args["command"] = ["bash", "-lc", args["command"]]
            if "timeout_ms" in args:
                args["timeout_ms"] = args["timeout_ms"] * 1000
        return args

    def decode_hook(self, kind, args):
        if kind == "run":
            cmd = args.get("command")
            if isinstance(cmd, list):
                if not cmd or not all(isinstance(c, str) for c in cmd):
                    raise CallError("shell: 'command' must be a non-empty list of strings")
                if len(cmd) == 3 and cmd[0] in SHELLS and cmd[1] in ("-lc", "-c"):
                    cmd = cmd[2]
                else:
                    cmd = shlex.join(cmd)
                args["command"] = cmd
            workdir = args.pop("workdir", None)
            if isinstance(workdir, str) and workdir not in ("", ".") and isinstance(args.get("command"), str):
                args["command"] = f"cd {shlex.quote(workdir)} && {args['command']}"
            t = args.get("timeout_ms")
            if isinstance(t, int) and not isinstance(t, bool):
                args["timeout_ms"] = max(1, -(-t // 1000))
        return args

    def render_system_prompt(self, toolset: ToolSet) -> str:
        tools = []
        for t in self.tools_json(toolset):
            if t["name"] == "apply_patch":
                tools.append({"type": "custom", "name": "apply_patch", "description": t["description"]})
            else:
                tools.append({"type": "function", **t})
        finish = self.TOOLS["finish"].name
        lines = [self.intro]
        if toolset.files or toolset.run:
            lines.append("The workspace is the current directory; use relative paths.")
        lines += [
            "",
            "Available tools:",
            json.dumps(tools, ensure_ascii=False),
            "",
            "Emit one JSON item per call: {\"type\": \"function_call\", \"call_id\": \"call_1\", "
            "\"name\": NAME, \"arguments\": \"<JSON string>\"}",
        ]
        if toolset.files:
            lines.append("apply_patch is a custom tool: {\"type\": \"custom_tool_call\", \"call_id\": \"call_2\", "
                         "\"name\": \"apply_patch\", \"input\": \"*** Begin Patch\\n...\\n*** End Patch\"}")
        lines.append(f"Call {finish} when the task is done.")
        return "\n".join(lines)

    def render_calls(self, actions: list[Action], start_index: int = 0) -> str:
        out = []
        for i, a in enumerate(actions):
            cid = self.call_id(start_index + i, "")
            if kind_of(a) in ("write", "edit"):
                out.append(dumps({"type": "custom_tool_call", "call_id": cid, "name": "apply_patch",
                                  "input": patch_text(a)}))
            else:
                name, args = self.encode(a)
                out.append(dumps({"type": "function_call", "call_id": cid, "name": name,
                                  "arguments": dumps(args)}))
        return "\n".join(out)

    def parse_calls(self, text: str, toolset: ToolSet, start_index: int) -> list[Call]:
        calls: list[Call] = []
        n_items = 0
        for obj in iter_json_objects(text):
            kind = obj.get("type", "function_call")
            if kind not in ("function_call", "custom_tool_call") or "name" not in obj:
                continue
            if len(calls) >= MAX_CALLS:
                calls.append(Call("", "", None, f"at most {MAX_CALLS} tool calls per turn"))
                break
            name = obj["name"] if isinstance(obj["name"], str) else repr(obj["name"])
            cid = obj.get("call_id") if isinstance(obj.get("call_id"), str) else self.call_id(start_index + n_items, name)
            n_items += 1
            try:
                if name == "apply_patch":
                    if not toolset.files:
                        raise CallError("apply_patch is not available in this task")
                    if "input" in obj:
                        patch = obj["input"]
                    else:
                        args = self._arguments(name, obj.get("arguments", "{}"))
                        patch = args.get("input", args.get("patch"))
                    for k, act in enumerate(parse_patch(patch)):
                        calls.append(Call(cid if k == 0 else f"{cid}#{k + 1}", name, act))
                else:
                    args = self._arguments(name, obj.get("arguments", "{}"))
                    calls.append(Call(cid, name, self.decode(name, args, toolset)))
            except CallError as e:
                calls.append(Call(cid, name, None, str(e)))
        return calls[: MAX_CALLS + 1]

    @staticmethod
    def _arguments(name: str, raw) -> dict:
        if isinstance(raw, dict):
            return raw
        try:
            args = json.loads(raw) if isinstance(raw, str) else None
        except (ValueError, RecursionError):
            args = None
        if not isinstance(args, dict):
            raise CallError(f"{name}: 'arguments' must be a JSON object encoded as a string")
        return args

    def result_text(self, o: Outcome) -> str:
        if not o.ok:
            return f"error: {o.text}"
        if o.run is not None:
            r = o.run
            head = f"Exit code: {r.exit_code}"
            if r.status != "exited":
                head += f" ({r.status.replace('_', ' ')})"
            return f"{head}\nOutput:\n{r.output}"
        if o.kind in ("write", "edit"):
            mark = "A" if o.kind == "write" else "M"
            return f"Success. Updated the following files:\n{mark} {o.call.action.path}"
        return self.plain_result(o, "L")

    def render_results(self, outcomes: list[Outcome]) -> str:
        # Operations of one patch share a call id ("call_3", "call_3#2"): one output item for all.
        groups: list[tuple[str, str, list[str]]] = []
        for o in outcomes:
            base = o.call.call_id.split("#")[0]
            item = "custom_tool_call_output" if o.call.tool == "apply_patch" else "function_call_output"
            if groups and groups[-1][0] == base and item == "custom_tool_call_output" and groups[-1][1] == item:
                groups[-1][2].append(self.result_text(o))
            else:
                groups.append((base, item, [self.result_text(o)]))
        return "\n".join(dumps({"type": item, "call_id": cid, "output": "\n".join(texts)})
                         for cid, item, texts in groups)

    def render_parse_error(self, message: str) -> str:
        return dumps({"type": "message", "role": "system", "content": f"error: {message}"})
