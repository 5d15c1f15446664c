"""Tools of the mock apps: a decorator, schemas read from type hints and docstrings, argument checks.

After tau2-bench's `@is_tool` toolkit (research/environments.md §2.1): each tool is a method of an
app's state class, marked `@tool("read")` or `@tool("write")`. Its JSON-schema-like description is
generated from the signature (types) and the docstring (first line: description; `Args:` block:
one `name: text` line per parameter), so the tool list a harness shows can never drift from the code.

Arguments that arrive from a policy are checked against the hints before the method runs; a wrong
name, a missing argument or a wrong type raises `ToolError`, which the environment turns into an
error observation.
"""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable


class ToolError(Exception):
    """A tool call that cannot be carried out; the message is shown to the policy."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # "string" | "integer" | "boolean" | "array" | "object"
    description: str
    required: bool
    items: str | None = None  # element type of an array


@dataclass(frozen=True)
class ToolSchema:
    app: str
    name: str
    kind: str  # "read" | "write"
    description: str
    params: tuple[Param, ...]

    def param(self, name: str) -> Param | None:
        for p in self.params:
            if p.name == name:
                return p
        return None


def tool(kind: str) -> Callable[[Callable], Callable]:
    """Mark a method as a tool; kind is "read" (never changes state) or "write"."""
    if kind not in ("read", "write"):
        raise ValueError(f"tool kind must be 'read' or 'write', got {kind!r}")

    def mark(fn: Callable) -> Callable:
        fn._tool_kind = kind
        return fn

    return mark


_SCALARS = {str: "string", int: "integer", bool: "boolean", dict: "object"}


def _json_type(hint: Any) -> tuple[str, str | None, bool]:
    """(json type, element type, optional) of a type hint."""
    optional = False
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        assert len(args) == 1, f"unsupported union hint {hint!r}"
        hint = args[0]
        origin = typing.get_origin(hint)
    if origin is list:
        (elem,) = typing.get_args(hint)
        return "array", _SCALARS[elem], optional
    if origin is dict:
        return "object", None, optional
    return _SCALARS[hint], None, optional


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    lines = inspect.cleandoc(doc or "").splitlines()
    description = lines[0] if lines else ""
    params: dict[str, str] = {}
    in_args = False
    for line in lines[1:]:
        if line.strip() == "Args:":
            in_args = True
            continue
        if in_args and ":" in line:
            name, text = line.strip().split(":", 1)
            params[name.strip()] = text.strip()
    return description, params


def build_schemas(cls: type, app: str) -> dict[str, ToolSchema]:
    """Schemas of every `@tool` method of `cls`, keyed by tool name."""
    out: dict[str, ToolSchema] = {}
    for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction):
        kind = getattr(fn, "_tool_kind", None)
        if kind is None:
            continue
        hints = typing.get_type_hints(fn)
        description, docs = _parse_docstring(fn.__doc__ or "")
        params = []
        for pname, p in inspect.signature(fn).parameters.items():
            if pname == "self":
                continue
            jtype, items, optional = _json_type(hints[pname])
            required = p.default is inspect.Parameter.empty and not optional
            params.append(Param(pname, jtype, docs.get(pname, ""), required, items))
        out[name] = ToolSchema(app, name, kind, description, tuple(params))
    return out


def _check_value(schema: ToolSchema, p: Param, value: Any) -> Any:
    where = f"{schema.app}.{schema.name}: argument {p.name!r}"
    if value is None:
        if p.required:
            raise ToolError(f"{where} is required")
        return None
    if p.type == "string":
        if not isinstance(value, str):
            raise ToolError(f"{where} must be a string, got {type(value).__name__}")
    elif p.type == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ToolError(f"{where} must be an integer, got {type(value).__name__}")
    elif p.type == "boolean":
        if not isinstance(value, bool):
            raise ToolError(f"{where} must be true or false, got {type(value).__name__}")
    elif p.type == "array":
        # One bare string for a list of strings is a common slip; accept it as a list of one.
        if isinstance(value, str) and p.items == "string":
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ToolError(f"{where} must be a list of strings")
    elif p.type == "object":
        if not isinstance(value, dict):
            raise ToolError(f"{where} must be an object")
    return value


def call_tool(obj: Any, schema: ToolSchema, args: dict[str, Any]) -> Any:
    """Check `args` against `schema` and run the tool method on `obj`."""
    if not isinstance(args, dict):
        raise ToolError(f"{schema.app}.{schema.name}: arguments must be an object")
    known = {p.name for p in schema.params}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ToolError(
            f"{schema.app}.{schema.name}: unknown argument(s) {unknown}; "
            f"it takes {sorted(known) or 'no arguments'}"
        )
    clean = {}
    for p in schema.params:
        if p.name in args:
            clean[p.name] = _check_value(schema, p, args[p.name])
        elif p.required:
            raise ToolError(f"{schema.app}.{schema.name}: argument {p.name!r} is required")
    return getattr(obj, schema.name)(**{k: v for k, v in clean.items() if v is not None})
