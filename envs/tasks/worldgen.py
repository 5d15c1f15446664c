"""Seeded building blocks for app worlds: people, mail, pages, channels, courses, timelines.

Everything here is a pure function of a `random.Random`, so a task's world is fixed by its seed.
Ids are allocated from an `Ids` counter owned by the generator, with prefixes that the apps never
use for objects the agent creates (agent mail is `s…`, agent pages `p…` counted from the state's
`next_page`), so a timeline event can never collide with something the agent made.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from envs.apps import Event, World
from envs.apps.canvas import Canvas
from envs.apps.gmail import Gmail
from envs.apps.notion import Notion
from envs.apps.slack import Slack

USER_EMAIL = "me@northwind.com"
SLACK_USER = "me"
START_DATE = "2026-09-07"  # a Monday
SCHOOL = "stateu.edu"

FIRST = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ines", "Jonas",
         "Keiko", "Liam", "Maya", "Nikolai", "Olu", "Priya", "Quinn", "Rosa", "Sami", "Tariq"]
LAST = ["Moreau", "Silva", "Wang", "Kowalski", "Obi", "Haddad", "Petrov", "Sato", "Garcia", "Berg",
        "Tanaka", "Murphy", "Levi", "Ivanov", "Adeyemi", "Nair", "Brooks", "Diaz", "Koskinen", "Aziz"]
TOPICS = ["budget review", "offsite agenda", "hiring plan", "Q3 roadmap", "vendor contract",
          "launch checklist", "design review", "security audit", "customer feedback", "team lunch",
          "onboarding guide", "incident report", "sprint retro", "pricing update", "travel booking"]
FACTS = {
    "wifi password": ["maple-{n}", "orbit-{n}", "falcon-{n}"],
    "meeting room": ["Room {n}A", "Room {n}B", "Atrium {n}"],
    "project code": ["PRJ-{n}", "NW-{n}", "OPS-{n}"],
    "budget figure": ["${n},000", "${n},500"],
    "deadline": ["September {d}", "October {d}"],
}
CHANNELS = [("general", "Company-wide announcements"), ("random", "Anything goes"),
            ("project-atlas", "Atlas project"), ("project-borealis", "Borealis project"),
            ("help-desk", "IT questions")]
COURSES = [("c101", "Linear Algebra"), ("c205", "Organic Chemistry"), ("c310", "World History"),
           ("c142", "Intro to Programming"), ("c230", "Microeconomics")]
ASSIGNMENT_KINDS = ["Problem Set", "Reading Response", "Lab Report", "Essay", "Quiz Prep", "Project Update"]
NEWSLETTERS = ["Tech Weekly", "Morning Brew", "Design Digest", "Data Notes", "Product Hunt Daily"]


@dataclass
class Ids:
    mail: int = 0
    page: int = 0
    block: int = 0
    seq: int = 0
    assignment: int = 0
    taken: set = field(default_factory=set)

    def next_mail(self) -> str:
        self.mail += 1
        return f"m{self.mail:04d}"

    def next_page(self) -> str:
        self.page += 1
        return f"n{self.page:04d}"

    def next_block(self) -> str:
        self.block += 1
        return f"k{self.block:04d}"

    def next_ts(self, day: int) -> str:
        self.seq += 1
        return f"d{day:03d}.{self.seq:04d}"

    def next_assignment(self) -> str:
        self.assignment += 1
        return f"a{self.assignment:03d}"


def person(rng: random.Random, domain: str = "northwind.com") -> tuple[str, str]:
    """(display name, address)."""
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return f"{first} {last}", f"{first.lower()}.{last.lower()}@{domain}"


def mail(ids: Ids, day: int, date: str, sender: str, subject: str, body: str,
         to: list[str] | None = None) -> dict:
    return {"id": ids.next_mail(), "sender": sender, "to": to or [USER_EMAIL], "subject": subject,
            "body": body, "date": date, "labels": [], "unread": True, "folder": "inbox", "cc": [],
            "reply_to": None}


def page(ids: Ids, title: str, paragraphs: list[str], created: str = "", todo: list[str] = ()) -> dict:
    blocks = [{"id": ids.next_block(), "type": "paragraph", "text": t, "checked": False} for t in paragraphs]
    blocks += [{"id": ids.next_block(), "type": "todo", "text": t, "checked": False} for t in todo]
    return {"id": ids.next_page(), "title": title, "blocks": blocks, "created": created}


def slack_msg(ids: Ids, day: int, user: str, text: str) -> dict:
    return {"ts": ids.next_ts(day), "user": user, "text": text, "day": day, "thread_ts": None,
            "reactions": {}}


def empty_world() -> World:
    return World(
        start_date=START_DATE,
        gmail=Gmail(user=USER_EMAIL),
        notion=Notion(),
        slack=Slack(user=SLACK_USER),
        canvas=Canvas(),
    )


def date_of(day: int) -> str:
    return empty_world().date_of(day)


def filler_world(rng: random.Random, ids: Ids, n_mail: int = 5, n_pages: int = 3, n_slack: int = 4,
                 n_courses: int = 2, n_assign: int = 2) -> World:
    """A day-0 world with unrelated mail, pages, messages and coursework, for tasks to hide in."""
    w = empty_world()
    today = w.date_of(0)
    for _ in range(n_mail):
        name, addr = person(rng)
        topic = rng.choice(TOPICS)
        w.gmail.deliver(mail(ids, 0, w.date_of(-rng.randint(0, 6)), addr, f"Re: {topic}",
                             f"Hi, a quick note on the {topic}. Let's discuss later. - {name.split()[0]}"))
    for _ in range(n_pages):
        topic = rng.choice(TOPICS)
        w.notion.add_page(page(ids, f"{topic.title()} notes",
                               [f"Notes about the {topic}.", f"Owner: {rng.choice(FIRST)}."]))
    for name, topic in CHANNELS[:3]:
        w.slack.add_channel(name, topic)
    for _ in range(n_slack):
        ch = rng.choice(CHANNELS[:3])[0]
        w.slack.deliver(ch, slack_msg(ids, 0, rng.choice(FIRST).lower(),
                                      f"Anyone looked at the {rng.choice(TOPICS)}?"))
    for cid, cname in rng.sample(COURSES, n_courses):
        w.canvas.add_course(cid, cname)
        for _ in range(n_assign):
            w.canvas.post(cid, assignment(rng, ids, posted=-rng.randint(1, 5), due=rng.randint(1, 14)))
    finish_ids(w, ids)
    return w


def assignment(rng: random.Random, ids: Ids, posted: int, due: int, title: str | None = None) -> dict:
    title = title or f"{rng.choice(ASSIGNMENT_KINDS)} {rng.randint(1, 12)}"
    return {"id": ids.next_assignment(), "title": title, "due": date_of(due),
            "points": rng.choice([10, 20, 25, 50, 100]),
            "description": f"Complete {title}. Submit the text of your answer.",
            "posted": date_of(posted), "submission": None, "submitted_on": None}


def finish_ids(w: World, ids: Ids) -> None:
    """Start the apps' own counters past everything the generator allocated."""
    w.slack.next_seq = max(w.slack.next_seq, ids.seq + 1)
    w.notion.next_block = max(w.notion.next_block, ids.block + 1)


def add_timeline(w: World, events: list[Event]) -> None:
    w.timeline = sorted(w.timeline + events, key=lambda e: e.day)
