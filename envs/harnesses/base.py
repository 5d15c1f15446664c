"""What every harness shares: tool tables, argument mapping, JSON scanning, result texts.

A harness is one way of writing the abstract action space (envs/actions.py) as text:

    render_system_prompt(toolset)  -> the tool list and call syntax the policy is shown
    render_calls([Action])         -> text a policy in this style would write (used by the experts)
    parse(text, toolset)           -> [Call]: an Action or an error message per call found
    render_results([Outcome])      -> the observation text for executed calls

Subclasses declare a table `TOOLS: {kind: ToolDef}` (tool name, parameters and which abstract field
each parameter carries) and the syntax; `encode` / `decode` do the generic mapping, with hooks for the
few tools whose arguments are not a plain rename (Kimi's nested `edit`, Codex's `apply_patch`, ...).

`parse` must never raise: whatever the text, the result is a list of calls (possibly empty) whose
errors become error observations (`Harness.parse` wraps each harness's `parse_calls` and turns any
exception into one error call). Parsing is linear in the text: tagged syntaxes are cut with
`tagged_blocks`, which looks for the closing tag once per opening tag and stops at the first opening
tag that has none (a regex `<a>(.*?)</a>` rescans to the end for every unclosed `<a>`, so 10^4
unclosed tags cost 10^9 steps); JSON scanning (`iter_json_objects`) charges every failed decode the
characters it read and stops when the charges reach a few times the text length. Limits keep hostile
input cheap: at most MAX_TEXT_CHARS characters are considered, at most MAX_CALLS calls per turn.
Integer arguments are ASCII digits only (`str.isdigit` accepts '²', which `int` refuses) and lie in
[-MAX_INT, MAX_INT] (a timeout of 10**400 would overflow `float`).
"""

from __future__ import annotations

import json
import logging
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any

from envs.actions import Action, AppCall, Edit, Finish, Read, Run, Search, Write, kind_of
from envs.apps import APPS, ToolSchema, app_tools
from envs.jail import CommandResult
from envs.sandbox import WORKDIR, ReadResult

MAX_TEXT_CHARS = 200_000
MAX_CALLS = 32
MAX_JSON_CANDIDATES = 2000
# Failed JSON decodes may read at most this many times the text's length in total (see iter_json_objects).
JSON_SCAN_FACTOR = 8
MAX_INT = 2**31 - 1
_INT_RE = re.compile(r"\s*-?[0-9]{1,10}\s*", re.ASCII)

log = logging.getLogger(__name__)


class CallError(Exception):
    """A call whose name or arguments are wrong; the message is shown to the policy."""


@dataclass(frozen=True)
class ToolSet:
    """Which tools a task offers: file tools, the shell, and any mock apps.

    `only`, when not empty, narrows that to the listed tools ("read", "search", "slack.post", ...),
    which keeps the prompts of the easiest tasks short. The finish tool is always offered."""

    files: bool = False
    run: bool = False
    apps: tuple[str, ...] = ()
    only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [a for a in self.apps if a not in APPS]
        if bad:
            raise ValueError(f"ToolSet.apps has unknown apps {bad}; the apps are {list(APPS)}")
        known = {"read", "write", "edit", "search", "run"}
        known |= {f"{app}.{name}" for app in self.apps for name in app_tools(app)}
        unknown = sorted(set(self.only) - known)
        if unknown:
            raise ValueError(f"ToolSet.only names unknown tools {unknown}; use kinds or 'app.tool' of {self.apps}")

    def kinds(self) -> tuple[str, ...]:
        out = []
        if self.files:
            out += ["read", "write", "edit", "search"]
        if self.run:
            out.append("run")
        if self.only:
            out = [k for k in out if k in self.only]
        return tuple(out) + ("finish",)

    def app_schemas(self) -> list[ToolSchema]:
        return [s for app in self.apps for s in app_tools(app).values()
                if not self.only or f"{app}.{s.name}" in self.only]

    def allows(self, action: Action) -> bool:
        if isinstance(action, AppCall):
            return any(s.app == action.app and s.name == action.tool for s in self.app_schemas())
        return kind_of(action) in self.kinds()


@dataclass(frozen=True)
class Arg:
    name: str  # the harness's parameter name
    field: str  # the abstract action field it carries
    type: str  # JSON type: string | integer | boolean | array | object
    description: str
    required: bool = False


@dataclass(frozen=True)
class ToolDef:
    name: str
    kind: str  # abstract kind, or "app"
    description: str
    args: tuple[Arg, ...]
    app: str | None = None
    app_tool: str | None = None
    # JSON-schema properties to show instead of `args`, for tools whose wire form is not a rename.
    shown: dict[str, Any] | None = None


def tool_def(name: str, kind: str, description: str, *args: tuple, shown: dict | None = None) -> ToolDef:
    """ToolDef from (name, field, type, description[, required]) tuples."""
    return ToolDef(name, kind, description, tuple(Arg(*a) for a in args), shown=shown)


@dataclass(frozen=True)
class Call:
    """One tool call found in a policy's text."""

    call_id: str
    tool: str
    action: Action | None
    error: str | None = None


@dataclass(frozen=True)
class Outcome:
    """The result of executing one call, before a harness formats it."""

    call: Call
    ok: bool
    text: str  # the message, or the plain output
    read: ReadResult | None = None
    run: CommandResult | None = None
    data: Any = None  # an app tool's JSON result

    @property
    def kind(self) -> str:
        return kind_of(self.call.action) if self.call.action is not None else "error"


# Tool descriptions shared by the harnesses (each words its own prompt around them).
DESCRIBE = {
    "read": "Read a text file (lines are numbered) or list a directory.",
    "write": "Create a file, or overwrite it, with the given content.",
    "edit": "Replace an exact piece of text in a file. It must occur exactly once unless replace-all is set.",
    "run": "Run a shell command in the workspace (no network; CPU, memory and time limits).",
    "search": "Search file contents with an extended regular expression; returns path:line:text.",
    "finish": "End the task. If the task asks a question, give the answer here.",
}

_DEFAULTS = {cls: {f.name: f.default for f in fields(cls)} for cls in (Read, Write, Edit, Run, Search, AppCall, Finish)}
_CLASS = {"read": Read, "write": Write, "edit": Edit, "run": Run, "search": Search, "finish": Finish}


def coerce(value: Any, jtype: str, where: str) -> Any:
    """Check (and gently convert) one argument value to its declared JSON type."""
    if jtype == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise CallError(f"{where} must be a string")
    if jtype == "integer":
        if isinstance(value, bool):
            raise CallError(f"{where} must be an integer")
        if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
            value = int(value)
        elif isinstance(value, str) and _INT_RE.fullmatch(value):
            value = int(value)
        if not isinstance(value, int):
            raise CallError(f"{where} must be an integer (ASCII digits)")
        if abs(value) > MAX_INT:
            raise CallError(f"{where} must be between {-MAX_INT} and {MAX_INT}")
        return value
    if jtype == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise CallError(f"{where} must be true or false")
    if jtype in ("array", "object"):
        if jtype == "array" and isinstance(value, str) and not value.lstrip().startswith("["):
            return [value]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                raise CallError(f"{where} must be a JSON {jtype}") from None
        if jtype == "array" and isinstance(value, list):
            return value
        if jtype == "object" and isinstance(value, dict):
            return value
        raise CallError(f"{where} must be a JSON {jtype}")
    raise AssertionError(f"unknown type {jtype}")


def iter_json_objects(text: str):
    """Yield every top-level JSON object embedded in free text, left to right.

    Each "{" is a candidate; a successful decode moves past the object. A failed decode is charged the
    characters it read (up to the error position, or to the end of the text for an unterminated string
    or a nesting/number error, whose position says nothing), and scanning stops once the charges pass
    JSON_SCAN_FACTOR times the text's length: nested unclosed objects (`{"a":[{"a":[...`) would
    otherwise make every level read the whole tail again."""
    decoder = json.JSONDecoder()
    pos, tries, charged = 0, 0, 0
    budget = JSON_SCAN_FACTOR * len(text) + 10_000
    while tries < MAX_JSON_CANDIDATES and charged <= budget:
        start = text.find("{", pos)
        if start < 0:
            return
        tries += 1
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as e:
            far = e.msg.startswith("Unterminated string")
            charged += (len(text) if far else e.pos) - start + 1
            pos = start + 1
            continue
        except (ValueError, RecursionError):
            charged += len(text) - start + 1
            pos = start + 1
            continue
        if isinstance(obj, dict):
            yield obj
        pos = max(end, start + 1)


def tagged_blocks(text: str, open_tag: str, close_tag: str, limit: int):
    """(start, end) of the bodies between `open_tag` and the next `close_tag`, left to right, at most
    `limit` + 1 of them; linear: each closing tag is looked for once, and an opening tag without one
    ends the scan (no later opening tag can have one either)."""
    pos, n = 0, 0
    while n <= limit:
        start = text.find(open_tag, pos)
        if start < 0:
            return
        body = start + len(open_tag)
        end = text.find(close_tag, body)
        if end < 0:
            return
        yield body, end
        n += 1
        pos = end + len(close_tag)


def numbered(lines: list[str], first: int, sep: str = "\t", width: int = 6) -> str:
    return "\n".join(f"{first + i:>{width}}{sep}{line}" for i, line in enumerate(lines))


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


class Harness(ABC):
    name = ""
    title = ""
    absolute_paths = False
    TOOLS: dict[str, ToolDef] = {}
    # The first line of every system prompt; a policy can use it to tell a new episode.
    intro = ""

    # --- paths -----------------------------------------------------------------------------
    def show_path(self, path: str) -> str:
        if not self.absolute_paths:
            return path
        if path in ("", "."):
            return WORKDIR
        return f"{WORKDIR}/{path}"

    def take_path(self, shown: str) -> str:
        if self.absolute_paths:
            if shown == WORKDIR:
                return "."
            if shown.startswith(WORKDIR + "/"):
                return shown[len(WORKDIR) + 1:] or "."
        return shown

    # --- tool tables -----------------------------------------------------------------------
    def tool_defs(self, toolset: ToolSet) -> list[ToolDef]:
        defs = [self.TOOLS[k] for k in toolset.kinds() if k != "finish"]
        defs += self.app_tool_defs(toolset)
        defs.append(self.TOOLS["finish"])
        return defs

    @abstractmethod
    def app_tool_name(self, app: str, tool: str) -> str:
        """The tool name under which this harness exposes `app.tool`."""

    def app_tool_defs(self, toolset: ToolSet) -> list[ToolDef]:
        out = []
        for s in toolset.app_schemas():
            args = tuple(Arg(p.name, p.name, p.type, p.description, p.required) for p in s.params)
            out.append(ToolDef(self.app_tool_name(s.app, s.name), "app", s.description, args, s.app, s.name))
        return out

    def lookup(self, tool: str, toolset: ToolSet) -> ToolDef:
        for d in self.tool_defs(toolset):
            if d.name == tool:
                return d
        names = [d.name for d in self.tool_defs(toolset)]
        raise CallError(f"unknown tool {tool!r}; the tools here are {names}")

    # --- action <-> (tool name, arguments) --------------------------------------------------
    def encode(self, action: Action) -> tuple[str, dict[str, Any]]:
        """The tool name and argument dict this harness uses for `action`."""
        kind = kind_of(action)
        if kind == "app":
            return self.app_tool_name(action.app, action.tool), dict(action.args)
        tdef = self.TOOLS[kind]
        defaults = _DEFAULTS[type(action)]
        args: dict[str, Any] = {}
        for a in tdef.args:
            value = getattr(action, a.field)
            if not a.required and value == defaults.get(a.field):
                continue
            args[a.name] = self.show_path(value) if a.field == "path" else value
        return tdef.name, self.encode_hook(kind, args)

    def encode_hook(self, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        """Adjust arguments for tools that are not a plain rename (see subclasses)."""
        return args

    def decode_hook(self, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        return args

    def decode(self, tool: str, args: Any, toolset: ToolSet) -> Action:
        """The action for a call of `tool` with `args`, or CallError."""
        tdef = self.lookup(tool, toolset)
        if not isinstance(args, dict):
            raise CallError(f"{tool}: the arguments must be a JSON object")
        if tdef.kind == "app":
            schema = app_tools(tdef.app)[tdef.app_tool]
            clean = {}
            for k, v in args.items():
                p = schema.param(k)
                # Unknown names and missing arguments are reported by the app itself (World.call).
                clean[k] = coerce(v, p.type, f"{tool}: argument {k!r}") if p is not None and v is not None else v
            return AppCall(tdef.app, tdef.app_tool, clean)
        args = self.decode_hook(tdef.kind, dict(args))
        known = {a.name: a for a in tdef.args}
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise CallError(f"{tool}: unknown argument(s) {unknown}; it takes {sorted(known) or 'none'}")
        values = {}
        for a in tdef.args:
            if a.name not in args or args[a.name] is None:
                if a.required:
                    raise CallError(f"{tool}: argument {a.name!r} is required")
                continue
            v = coerce(args[a.name], a.type, f"{tool}: argument {a.name!r}")
            values[a.field] = self.take_path(v) if a.field == "path" else v
        return _CLASS[tdef.kind](**values)

    # --- rendering ---------------------------------------------------------------------------
    @abstractmethod
    def render_system_prompt(self, toolset: ToolSet) -> str:
        """The system prompt: role, tool list and call syntax."""

    def render_initial(self, system_prompt: str, instruction: str) -> str:
        return f"{system_prompt}\n\n{instruction}"

    @abstractmethod
    def call_id(self, index: int, tool: str) -> str:
        """The id this harness gives the `index`-th call of an episode (0-based)."""

    @abstractmethod
    def render_calls(self, actions: list[Action], start_index: int = 0) -> str:
        """The text a policy in this style writes to make these calls."""

    def parse(self, text: str, toolset: ToolSet, start_index: int = 0) -> list[Call]:
        """Every call in `text`; never raises. Calls without an id get call_id(start_index + i)."""
        if (why := self.clip(text)) is not None:
            return [Call("", "", None, why)]
        try:
            return self.parse_calls(text, toolset, start_index)
        except Exception as e:  # noqa: BLE001 - policy text must never crash the env; the bug is logged
            log.warning("envs: the %s parser raised %s on policy text", self.name, type(e).__name__, exc_info=True)
            return [Call("", "", None, f"the calls could not be read ({type(e).__name__})")]

    @abstractmethod
    def parse_calls(self, text: str, toolset: ToolSet, start_index: int) -> list[Call]:
        """`parse` for text already clipped to MAX_TEXT_CHARS; may raise only on a bug."""

    @abstractmethod
    def render_results(self, outcomes: list[Outcome]) -> str:
        """The observation text for the outcomes of one turn."""

    @abstractmethod
    def render_parse_error(self, message: str) -> str:
        """The observation for a turn in which no call could be read."""

    # --- shared helpers ----------------------------------------------------------------------
    def clip(self, text: str) -> str | None:
        """None if the text is usable, or the reason it is not."""
        if not isinstance(text, str):
            return "the action must be text"
        if len(text) > MAX_TEXT_CHARS:
            return f"the action is {len(text)} characters long; the limit is {MAX_TEXT_CHARS}"
        return None

    def plain_result(self, o: Outcome, read_style: str = "cat") -> str:
        """A harness-neutral text of an outcome, with the read output numbered in `read_style`."""
        if not o.ok:
            return o.text
        if o.read is not None:
            r = o.read
            if r.is_dir:
                return "\n".join(r.lines) if r.lines else "(empty directory)"
            if not r.lines:
                return "(empty file)" if r.total_lines == 0 else f"(no lines from {r.first_line}; the file has {r.total_lines})"
            if read_style == "cat":
                return numbered(r.lines, r.first_line)
            if read_style == "L":
                return "\n".join(f"L{r.first_line + i}: {ln}" for i, ln in enumerate(r.lines))
            if read_style == "bar":
                return numbered(r.lines, r.first_line, sep="|")
            return "\n".join(r.lines)
        if o.data is not None:
            return dumps(o.data)
        return o.text

    def tools_json(self, toolset: ToolSet) -> list[dict[str, Any]]:
        """OpenAI-style function schemas of the tools (used by several prompts)."""
        out = []
        for d in self.tool_defs(toolset):
            props: dict[str, Any] = dict(d.shown or {})
            for a in ([] if d.shown else d.args):
                spec: dict[str, Any] = {"type": a.type}
                if a.description:
                    spec["description"] = a.description
                if a.type == "array":
                    spec["items"] = {"type": "string"}
                props[a.name] = spec
            out.append({
                "name": d.name,
                "description": d.description,
                "parameters": {"type": "object", "properties": props,
                               "required": [a.name for a in d.args if a.required and a.name in props]},
            })
        return out
