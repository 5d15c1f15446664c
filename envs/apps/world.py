"""The app world: Gmail, Notion, Slack and Canvas under one simulated clock, with a seeded timeline.

    World = (day, start date, gmail, notion, slack, canvas, timeline of future events)

- `advance_day()` moves the clock one day and applies that day's scheduled events in order: mail
  arrives, messages are posted, assignments are published, colleagues create pages. State carries
  across days; nothing is ever reset.
- Events only add records, so the world an agent leaves behind can be compared with the world the
  same timeline would have produced with no agent at all (`reference`): `diff(reference, final)` lists
  exactly the agent's changes, which the task verifier checks against its allowed set (AppWorld's
  collateral-damage check, research/environments.md §2.2).
- `to_json()` is the whole state, including the events still to come; `from_json` restores it
  exactly, and `digest()` is the sha256 of its canonical JSON.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from envs.apps.base import ToolError, ToolSchema, build_schemas, call_tool, tool
from envs.apps.canvas import Canvas
from envs.apps.gmail import Gmail
from envs.apps.notion import Notion
from envs.apps.slack import Slack

APPS = ("gmail", "notion", "slack", "canvas", "clock")
# Fields whose change is not an edit by the agent (opening a mail marks it read).
IGNORED_FIELDS = {"gmail/messages": {"unread"}}


@dataclass(frozen=True)
class Event:
    day: int
    app: str  # gmail | slack | canvas | notion
    data: dict[str, Any]


class Clock:
    """The simulated calendar: today's date and the end-of-day transition."""

    def __init__(self, world: World):
        self._world = world

    @tool("read")
    def today(self) -> dict[str, Any]:
        """Return today's date, weekday and simulated day number."""
        w = self._world
        d = w.date
        return {"date": d.isoformat(), "weekday": d.strftime("%A"), "day": w.day}

    @tool("write")
    def advance_day(self) -> dict[str, Any]:
        """End today and move to the next day; returns what arrived overnight."""
        return self._world.advance_day()


@dataclass
class World:
    start_date: str
    gmail: Gmail
    notion: Notion
    slack: Slack
    canvas: Canvas
    day: int = 0
    timeline: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.timeline = sorted(self.timeline, key=lambda e: e.day)
        self._sync_dates()

    # --- clock -----------------------------------------------------------------------------
    @property
    def date(self) -> dt.date:
        return dt.date.fromisoformat(self.start_date) + dt.timedelta(days=self.day)

    def date_of(self, day: int) -> str:
        return (dt.date.fromisoformat(self.start_date) + dt.timedelta(days=day)).isoformat()

    def _sync_dates(self) -> None:
        today = self.date.isoformat()
        self.gmail.today = today
        self.notion.today = today
        self.canvas.today = today
        self.slack.day = self.day

    def apply(self, event: Event) -> None:
        """Apply one event to the app it belongs to."""
        data = copy.deepcopy(event.data)
        if event.app == "gmail":
            self.gmail.deliver(data)
        elif event.app == "slack":
            self.slack.deliver(data.pop("channel"), data)
        elif event.app == "canvas":
            self.canvas.post(data.pop("course_id"), data)
        elif event.app == "notion":
            self.notion.add_page(data)
        else:
            raise ValueError(f"event for unknown app {event.app!r}")

    def advance_day(self) -> dict[str, Any]:
        self.day += 1
        self._sync_dates()
        arrived: dict[str, int] = {}
        rest = []
        for e in self.timeline:
            if e.day <= self.day:
                self.apply(e)
                arrived[e.app] = arrived.get(e.app, 0) + 1
            else:
                rest.append(e)
        self.timeline = rest
        return {"date": self.date.isoformat(), "weekday": self.date.strftime("%A"),
                "day": self.day, "new": arrived}

    # --- tools -----------------------------------------------------------------------------
    def app_object(self, app: str) -> Any:
        if app == "clock":
            return Clock(self)
        if app in ("gmail", "notion", "slack", "canvas"):
            return getattr(self, app)
        raise ToolError(f"unknown app {app!r}; apps are {list(APPS)}")

    def call(self, app: str, tool_name: str, args: dict[str, Any]) -> Any:
        """Run `app.tool_name(**args)`; raises ToolError for anything the policy got wrong."""
        schemas = app_tools(app)
        if tool_name not in schemas:
            raise ToolError(f"{app} has no tool {tool_name!r}; its tools are {sorted(schemas)}")
        return call_tool(self.app_object(app), schemas[tool_name], args)

    # --- state -----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "start_date": self.start_date,
            "day": self.day,
            "gmail": self.gmail.to_json(),
            "notion": self.notion.to_json(),
            "slack": self.slack.to_json(),
            "canvas": self.canvas.to_json(),
            "timeline": [{"day": e.day, "app": e.app, "data": e.data} for e in self.timeline],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> World:
        # A private copy: records must never share lists with the caller's dict (a task's spec).
        data = copy.deepcopy(data)
        return cls(
            start_date=data["start_date"],
            day=data["day"],
            gmail=Gmail.from_json(data["gmail"]),
            notion=Notion.from_json(data["notion"]),
            slack=Slack.from_json(data["slack"]),
            canvas=Canvas.from_json(data["canvas"]),
            timeline=[Event(e["day"], e["app"], e["data"]) for e in data["timeline"]],
        )

    def copy(self) -> World:
        return World.from_json(self.to_json())

    def digest(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def records(self) -> dict[str, dict[str, Any]]:
        """Every record of every app, keyed "app/collection/id"."""
        out: dict[str, dict[str, Any]] = {}
        for app in (self.gmail, self.notion, self.slack, self.canvas):
            out.update(app.records())
        return out


_SCHEMAS: dict[str, dict[str, ToolSchema]] = {}


def app_tools(app: str) -> dict[str, ToolSchema]:
    """Tool schemas of one app, keyed by tool name."""
    if app not in _SCHEMAS:
        classes = {"gmail": Gmail, "notion": Notion, "slack": Slack, "canvas": Canvas, "clock": Clock}
        if app not in classes:
            raise ToolError(f"unknown app {app!r}; apps are {list(APPS)}")
        _SCHEMAS[app] = build_schemas(classes[app], app)
    return _SCHEMAS[app]


@dataclass(frozen=True)
class Change:
    key: str  # "app/collection/id..."
    op: str  # added | removed | updated
    fields: tuple[str, ...]  # changed fields (all fields for added/removed)
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @property
    def collection(self) -> str:
        return "/".join(self.key.split("/")[:2])


def diff(before: World, after: World) -> list[Change]:
    """Record-level changes from `before` to `after`, ignoring fields in IGNORED_FIELDS."""
    a, b = before.records(), after.records()
    out = []
    for key in sorted(set(a) | set(b)):
        ignored = IGNORED_FIELDS.get("/".join(key.split("/")[:2]), set())
        if key not in a:
            out.append(Change(key, "added", tuple(sorted(b[key])), None, b[key]))
        elif key not in b:
            out.append(Change(key, "removed", tuple(sorted(a[key])), a[key], None))
        else:
            changed = tuple(sorted(f for f in set(a[key]) | set(b[key])
                                   if f not in ignored and a[key].get(f) != b[key].get(f)))
            if changed:
                out.append(Change(key, "updated", changed, a[key], b[key]))
    return out
