"""Mock Slack: channels of messages with read, post and emoji reactions.

State: channels by name, each a list of `Message`s with a timestamp id `ts` ("d003.0007": day 3,
seventh message of the workspace). Reactions are stored as {emoji: [users]}. New timestamps come from
a counter in the state, so a replayed episode posts with the same ids.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from envs.apps.base import ToolError, tool


@dataclass
class Message:
    ts: str
    user: str
    text: str
    day: int
    thread_ts: str | None = None
    reactions: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Channel:
    name: str
    topic: str
    messages: list[Message] = field(default_factory=list)


@dataclass
class Slack:
    user: str
    channels: dict[str, Channel] = field(default_factory=dict)
    next_seq: int = 1
    day: int = 0

    def add_channel(self, name: str, topic: str) -> None:
        self.channels[name] = Channel(name, topic)

    def deliver(self, channel: str, data: dict[str, Any]) -> None:
        self.channels[channel].messages.append(Message(**data))

    def to_json(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "next_seq": self.next_seq,
            "day": self.day,
            "channels": [
                {"name": c.name, "topic": c.topic, "messages": [asdict(m) for m in c.messages]}
                for c in self.channels.values()
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Slack:
        s = cls(user=data["user"], next_seq=data["next_seq"], day=data["day"])
        for c in data["channels"]:
            s.add_channel(c["name"], c["topic"])
            for m in c["messages"]:
                s.deliver(c["name"], m)
        return s

    def records(self) -> dict[str, dict[str, Any]]:
        return {
            f"slack/messages/{c.name}/{m.ts}": {**asdict(m), "channel": c.name}
            for c in self.channels.values()
            for m in c.messages
        }

    def _channel(self, channel: str) -> Channel:
        name = channel.lstrip("#")
        if name not in self.channels:
            raise ToolError(f"slack: no channel {channel!r}; slack.list_channels shows them")
        return self.channels[name]

    # --- tools -----------------------------------------------------------------------------
    @tool("read")
    def list_channels(self) -> list[dict[str, Any]]:
        """List channels with their topic and message count."""
        return [{"name": c.name, "topic": c.topic, "messages": len(c.messages)}
                for c in self.channels.values()]

    @tool("read")
    def read(self, channel: str, day: int | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Read the latest messages of a channel, oldest first.

        Args:
            channel: channel name, with or without '#'
            day: only messages of this simulated day (clock.today shows the current day)
            limit: at most this many messages
        """
        msgs = [m for m in self._channel(channel).messages if day is None or m.day == day]
        msgs = msgs[-limit:] if limit > 0 else []
        return [{"ts": m.ts, "user": m.user, "text": m.text,
                 "reactions": {k: list(v) for k, v in m.reactions.items()}} for m in msgs]

    @tool("write")
    def post(self, channel: str, text: str, thread_ts: str | None = None) -> dict[str, Any]:
        """Post a message to a channel, or into a thread when thread_ts is given.

        Args:
            channel: channel name
            text: message text
            thread_ts: ts of the message to answer in a thread
        """
        c = self._channel(channel)
        if not text.strip():
            raise ToolError("slack.post: the text must not be empty")
        if thread_ts is not None and all(m.ts != thread_ts for m in c.messages):
            raise ToolError(f"slack.post: #{c.name} has no message {thread_ts!r}")
        ts = f"d{self.day:03d}.{self.next_seq:04d}"
        self.next_seq += 1
        c.messages.append(Message(ts=ts, user=self.user, text=text, day=self.day, thread_ts=thread_ts))
        return {"channel": c.name, "ts": ts}

    @tool("write")
    def react(self, channel: str, ts: str, emoji: str) -> dict[str, Any]:
        """Add an emoji reaction to a message.

        Args:
            channel: channel name
            ts: the message ts
            emoji: emoji name without colons, e.g. white_check_mark
        """
        c = self._channel(channel)
        name = emoji.strip(":")
        if not name:
            raise ToolError("slack.react: the emoji must not be empty")
        for m in c.messages:
            if m.ts == ts:
                users = m.reactions.setdefault(name, [])
                if self.user not in users:
                    users.append(self.user)
                return {"ts": ts, "reactions": {k: list(v) for k, v in m.reactions.items()}}
        raise ToolError(f"slack.react: #{c.name} has no message {ts!r}")
