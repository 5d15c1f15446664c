"""Mock apps: typed tools, argument checks, the clock and timeline, JSON round trips, the diff."""

import json

import pytest

from envs.apps import Event, ToolError, World, app_tools, diff
from envs.tasks import generate
from envs.tasks import worldgen as wg


@pytest.fixture
def world():
    w = wg.empty_world()
    ids = wg.Ids()
    w.gmail.deliver(wg.mail(ids, 0, w.date_of(0), "ana@x.com", "Budget", "numbers inside"))
    w.slack.add_channel("general", "all")
    w.slack.deliver("general", wg.slack_msg(ids, 0, "bo", "hi @me"))
    w.canvas.add_course("c1", "Algebra")
    w.canvas.post("c1", wg.assignment(__import__("random").Random(0), ids, posted=0, due=2, title="Set 1"))
    w.notion.add_page(wg.page(ids, "Notes", ["first"], todo=["call Ana"]))
    wg.add_timeline(w, [
        Event(1, "gmail", wg.mail(ids, 1, w.date_of(1), "cy@x.com", "Day one", "hello")),
        Event(2, "slack", {"channel": "general", **wg.slack_msg(ids, 2, "cy", "day two")}),
        Event(2, "canvas", {"course_id": "c1", **wg.assignment(__import__("random").Random(1), ids, 2, 5, "Set 2")}),
        Event(3, "notion", wg.page(ids, "Draft: Set 2", ["answer"])),
    ])
    wg.finish_ids(w, ids)
    return w


def test_schemas_come_from_signatures():
    send = app_tools("gmail")["send"]
    assert send.kind == "write" and send.description.startswith("Send")
    assert {p.name: (p.type, p.required) for p in send.params} == {
        "to": ("array", True), "subject": ("string", True), "body": ("string", True),
        "cc": ("array", False), "reply_to": ("string", False)}
    assert app_tools("gmail")["search"].kind == "read"
    assert set(app_tools("clock")) == {"today", "advance_day"}


def test_argument_checks(world):
    for app, tool, args in [
        ("gmail", "read", {}),
        ("gmail", "read", {"message_id": 5}),
        ("gmail", "read", {"message_id": "m0001", "extra": 1}),
        ("gmail", "read", {"message_id": "nope"}),
        ("gmail", "send", {"to": [], "subject": "s", "body": "b"}),
        ("slack", "post", {"channel": "nochannel", "text": "x"}),
        ("slack", "read", {"channel": "general", "limit": True}),
        ("canvas", "submit", {"course_id": "c1", "assignment_id": "a001", "text": "  "}),
        ("notion", "append_block", {"page_id": "n0001", "text": "x", "type": "heading"}),
        ("gmail", "teleport", {}),
        ("spotify", "play", {}),
    ]:
        with pytest.raises(ToolError):
            world.call(app, tool, args)
    assert world.call("gmail", "send", {"to": "a@b.c", "subject": "s", "body": "b"})["id"] == "s0001"


def test_tools_read_and_write(world):
    (hit,) = world.call("gmail", "search", {"query": "budget"})
    assert hit["unread"] and world.call("gmail", "read", {"message_id": hit["id"]})["body"] == "numbers inside"
    assert world.gmail.messages[hit["id"]].unread is False
    world.call("gmail", "label", {"message_id": hit["id"], "label": "finance"})
    assert world.call("gmail", "search", {"label": "finance"})[0]["id"] == hit["id"]
    ts = world.call("slack", "post", {"channel": "#general", "text": "hello"})["ts"]
    world.call("slack", "react", {"channel": "general", "ts": ts, "emoji": ":tada:"})
    assert world.call("slack", "read", {"channel": "general"})[-1]["reactions"] == {"tada": ["me"]}
    pid = world.call("notion", "create_page", {"title": "Plan", "text": "step 1"})["id"]
    bid = world.call("notion", "append_block", {"page_id": pid, "text": "buy milk", "type": "todo"})["block_id"]
    world.call("notion", "update_block", {"page_id": pid, "block_id": bid, "checked": True})
    assert world.call("notion", "get_page", {"page_id": pid})["blocks"][1]["checked"] is True
    assert world.call("canvas", "list_assignments", {"course_id": "c1"})[0]["status"] == "open"


def test_days_carry_state_and_apply_the_timeline(world):
    pid = world.call("notion", "create_page", {"title": "Mine"})["id"]
    assert world.call("clock", "today", {})["day"] == 0
    out = world.call("clock", "advance_day", {})
    assert out["day"] == 1 and out["new"] == {"gmail": 1}
    assert [m["subject"] for m in world.call("gmail", "search", {"received": world.date_of(1)})] == ["Day one"]
    world.advance_day()
    assert world.call("slack", "read", {"channel": "general", "day": 2})[0]["text"] == "day two"
    assert len(world.canvas.courses["c1"].assignments) == 2
    world.advance_day()
    assert [p["title"] for p in world.call("notion", "search", {"query": "draft"})] == ["Draft: Set 2"]
    assert pid in world.notion.pages  # what the agent made on day 0 is still there on day 3
    # Set 1 was due on day 2 and never submitted.
    assert world.call("canvas", "list_assignments", {"course_id": "c1", "status": "missing"})[0]["title"] == "Set 1"
    assert world.timeline == []


def test_json_round_trip_is_exact(world):
    world.advance_day()
    world.call("gmail", "send", {"to": ["z@z.z"], "subject": "s", "body": "b"})
    again = World.from_json(world.to_json())
    assert again.to_json() == world.to_json() and again.digest() == world.digest()
    world.advance_day()
    again.advance_day()
    assert again.digest() == world.digest()


def test_diff_sees_every_record_change_but_not_opening_mail(world):
    before = world.copy()
    world.call("gmail", "read", {"message_id": "m0001"})
    assert diff(before, world) == []
    world.call("gmail", "archive", {"message_id": "m0001"})
    world.call("notion", "append_block", {"page_id": "n0001", "text": "x"})
    ts = world.call("slack", "post", {"channel": "general", "text": "yo"})["ts"]
    changes = {c.key: (c.op, c.fields) for c in diff(before, world)}
    assert changes["gmail/messages/m0001"] == ("updated", ("folder",))
    assert changes[f"slack/messages/general/{ts}"][0] == "added"
    assert any(k.startswith("notion/blocks/n0001/") and v[0] == "added" for k, v in changes.items())
    assert len(changes) == 3


def test_generated_worlds_are_deterministic():
    a, b = generate("assistant_2week", 5), generate("assistant_2week", 5)
    assert a.to_json() == b.to_json()
    assert generate("assistant_2week", 6).to_json() != a.to_json()
    w = World.from_json(a.spec["world"])
    for _ in range(14):
        w.advance_day()
    assert w.timeline == [] and len(w.gmail.messages) > 30


def test_worlds_never_alias_the_task_spec():
    task = generate("gmail_label", 2)
    before = json.dumps(task.spec, sort_keys=True)
    w = World.from_json(task.spec["world"])
    target = task.spec["target"]
    w.call("gmail", "label", {"message_id": target, "label": "x"})
    w.call("gmail", "read", {"message_id": target})
    assert json.dumps(task.spec, sort_keys=True) == before
