"""Mock Gmail: a mailbox of typed messages with search, read, send, label and archive.

State: `Email` records keyed by id (`m…` for mail that arrived, `s…` for mail the user sent), the
user's address, and a counter for new ids. Dates are ISO days; the world clock (world.py) stamps
mail that arrives on a later simulated day. Opening a message clears `unread`; the diff check
(world.py) ignores that field, as a person opening a mail is not a change to the mailbox.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from envs.apps.base import ToolError, tool


@dataclass
class Email:
    id: str
    sender: str
    to: list[str]
    subject: str
    body: str
    date: str
    labels: list[str] = field(default_factory=list)
    unread: bool = True
    folder: str = "inbox"  # inbox | sent | archive
    cc: list[str] = field(default_factory=list)
    reply_to: str | None = None


FOLDERS = ("inbox", "sent", "archive")


@dataclass
class Gmail:
    user: str
    messages: dict[str, Email] = field(default_factory=dict)
    next_sent: int = 1
    today: str = ""

    # --- state -----------------------------------------------------------------------------
    def deliver(self, data: dict[str, Any]) -> None:
        email = Email(**data)
        assert email.id not in self.messages, f"duplicate mail id {email.id}"
        self.messages[email.id] = email

    def to_json(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "next_sent": self.next_sent,
            "today": self.today,
            "messages": [asdict(m) for m in self.messages.values()],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Gmail:
        g = cls(user=data["user"], next_sent=data["next_sent"], today=data["today"])
        for m in data["messages"]:
            g.deliver(m)
        return g

    def records(self) -> dict[str, dict[str, Any]]:
        return {f"gmail/messages/{m.id}": asdict(m) for m in self.messages.values()}

    def _get(self, message_id: str) -> Email:
        if message_id not in self.messages:
            raise ToolError(f"gmail: no message with id {message_id!r}; use gmail.search to find ids")
        return self.messages[message_id]

    # --- tools -----------------------------------------------------------------------------
    @tool("read")
    def search(
        self,
        query: str = "",
        folder: str = "inbox",
        label: str | None = None,
        unread_only: bool = False,
        received: str | None = None,
        limit: int = 20,
    ) -> list[dict[str, Any]]:
        """Search messages, newest first; returns id, sender, subject, date, labels, unread.

        Args:
            query: words that must all appear in sender, subject or body; `from:x` matches the sender only
            folder: inbox, sent, archive, or all
            label: only messages with this label
            unread_only: only unread messages
            received: only messages dated this day (YYYY-MM-DD)
            limit: at most this many results
        """
        if folder not in FOLDERS + ("all",):
            raise ToolError(f"gmail.search: folder must be one of {list(FOLDERS) + ['all']}")
        terms = query.lower().split()
        hits = []
        for m in self.messages.values():
            if folder != "all" and m.folder != folder:
                continue
            if label is not None and label not in m.labels:
                continue
            if unread_only and not m.unread:
                continue
            if received is not None and m.date != received:
                continue
            text = f"{m.sender} {m.subject} {m.body}".lower()
            ok = True
            for t in terms:
                if t.startswith("from:"):
                    ok &= t[5:] in m.sender.lower()
                else:
                    ok &= t in text
            if ok:
                hits.append(m)
        hits.sort(key=lambda m: (m.date, m.id), reverse=True)
        return [
            {"id": m.id, "from": m.sender, "subject": m.subject, "date": m.date,
             "labels": list(m.labels), "unread": m.unread}
            for m in hits[: max(limit, 0)]
        ]

    @tool("read")
    def read(self, message_id: str) -> dict[str, Any]:
        """Open one message (marks it read) and return all its fields.

        Args:
            message_id: the id from gmail.search
        """
        m = self._get(message_id)
        m.unread = False
        return {"id": m.id, "from": m.sender, "to": list(m.to), "cc": list(m.cc),
                "subject": m.subject, "date": m.date, "labels": list(m.labels), "body": m.body}

    @tool("write")
    def send(
        self, to: list[str], subject: str, body: str,
        cc: list[str] | None = None, reply_to: str | None = None,
    ) -> dict[str, Any]:
        """Send a new message, or a reply when reply_to is given.

        Args:
            to: recipient addresses
            subject: subject line
            body: message text
            cc: copied addresses
            reply_to: id of the message this answers
        """
        if not to:
            raise ToolError("gmail.send: 'to' needs at least one address")
        if reply_to is not None:
            self._get(reply_to)
        mid = f"s{self.next_sent:04d}"
        self.next_sent += 1
        self.messages[mid] = Email(
            id=mid, sender=self.user, to=list(to), subject=subject, body=body, date=self.today,
            unread=False, folder="sent", cc=list(cc or []), reply_to=reply_to,
        )
        return {"id": mid, "status": "sent"}

    @tool("write")
    def label(self, message_id: str, label: str) -> dict[str, Any]:
        """Add a label to a message.

        Args:
            message_id: the id from gmail.search
            label: the label name
        """
        m = self._get(message_id)
        if not label.strip():
            raise ToolError("gmail.label: the label must not be empty")
        if label not in m.labels:
            m.labels.append(label)
        return {"id": m.id, "labels": list(m.labels)}

    @tool("write")
    def archive(self, message_id: str) -> dict[str, Any]:
        """Move a message out of the inbox into the archive.

        Args:
            message_id: the id from gmail.search
        """
        m = self._get(message_id)
        if m.folder == "sent":
            raise ToolError("gmail.archive: sent messages cannot be archived")
        m.folder = "archive"
        return {"id": m.id, "folder": m.folder}
