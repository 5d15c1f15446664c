"""Cross-app assistant families (domain general_agents), from one tool call to over a thousand.

| family                 | difficulty | what the agent must do                                          | expert calls |
|------------------------|------------|-----------------------------------------------------------------|--------------|
| slack_post             | easy       | post a given message in a channel                               | 2            |
| gmail_label            | easy       | find one mail by sender and subject, add a label                | 3            |
| gmail_reply_notion     | medium     | read a request, look the fact up in Notion, reply to the mail   | 6            |
| canvas_submit_drafts   | medium     | submit the assignments due this week from Notion drafts         | 9-15         |
| slack_todos_to_notion  | medium     | copy "TODO:" messages of a channel into a Notion to-do list     | 5-8          |
| assistant_3day         | medium     | the daily routine below over 3 simulated days                   | ~30          |
| assistant_2week        | hard       | the daily routine over 14 days                                  | ~150         |
| assistant_term         | marathon   | the daily routine over 90 days                                  | ~1100        |

The daily routine: label school mail, archive newsletters, acknowledge Slack mentions with a
reaction, submit each new assignment the day it appears (text from its Notion draft), then
`clock.advance_day`. Mail, messages, assignments and drafts arrive from a seeded timeline, so state
carries across days, and goals are checked day by day (an assignment submitted a day late fails).
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from envs.actions import AppCall, Finish
from envs.apps import Event, World
from envs.harnesses.base import ToolSet
from envs.tasks import worldgen as wg
from envs.tasks.base import Task, WorldFamily


def budget(task: Task, n_actions: int, tokens_per_step: int = 200) -> Task:
    steps = max(8, 2 * n_actions + 6)
    return replace(task, max_steps=steps, max_tokens=tokens_per_step * steps + 2000)


def _task(family: WorldFamily, seed: int, instruction: str, apps: tuple[str, ...], spec: dict,
          only: tuple[str, ...] = ()) -> Task:
    t = Task(family.name, seed, family.domain, family.difficulty, instruction,
             ToolSet(apps=apps, only=only), 0, 0, spec)
    return budget(t, len(family.solution(t)))


def _sent_by_me(world: World) -> list:
    return [m for m in world.gmail.messages.values() if m.folder == "sent"]


class SlackPost(WorldFamily):
    name = "slack_post"
    domain = "general_agents"
    difficulty = "easy"
    description = "Post a given message in a given Slack channel."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        ids = wg.Ids()
        w = wg.filler_world(rng, ids, n_mail=2, n_pages=1, n_slack=3, n_courses=1, n_assign=1)
        channel = rng.choice(list(w.slack.channels))
        topic = rng.choice(wg.TOPICS)
        text = rng.choice([f"The {topic} moves to {rng.choice(['Tuesday', 'Thursday', 'Friday'])}.",
                           f"Please send me your notes on the {topic} by {rng.randint(2, 5)} pm.",
                           f"Reminder: the {topic} starts in {rng.randint(5, 30)} minutes."])
        spec = {"world": w.to_json(), "channel": channel, "text": text}
        return _task(self, seed, f'Post this message in the #{channel} Slack channel: "{text}"', ("slack",), spec,
                     only=("slack.list_channels", "slack.read", "slack.post"))

    def solution(self, task):
        s = task.spec
        return [AppCall("slack", "post", {"channel": s["channel"], "text": s["text"]}), Finish()]

    def _mine(self, task, world):
        c = world.slack.channels[task.spec["channel"]]
        return [m for m in c.messages if m.user == wg.SLACK_USER]

    def goals(self, task, world, answer):
        mine = self._mine(task, world)
        return {"posted_once": len(mine) == 1 and mine[0].text.strip() == task.spec["text"]}

    def allowed(self, task, c):
        return (c.op == "added" and c.key.startswith(f"slack/messages/{task.spec['channel']}/")
                and c.after["user"] == wg.SLACK_USER)


class GmailLabel(WorldFamily):
    name = "gmail_label"
    domain = "general_agents"
    difficulty = "easy"
    description = "Find one email by sender and subject and add a label to it."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        ids = wg.Ids()
        w = wg.filler_world(rng, ids, n_mail=4, n_pages=1, n_slack=2, n_courses=1, n_assign=1)
        name, addr = wg.person(rng)
        topics = rng.sample(wg.TOPICS, 2)
        target = wg.mail(ids, 0, w.date_of(0), addr, f"{topics[0].capitalize()} for next week",
                         f"Hi, here is the {topics[0]} we discussed. Thanks, {name.split()[0]}")
        other = wg.mail(ids, 0, w.date_of(-1), addr, f"Question about the {topics[1]}",
                        f"Do you have a minute for the {topics[1]}? {name.split()[0]}")
        for m in (target, other):
            w.gmail.deliver(m)
        label = rng.choice(["finance", "follow-up", "clients", "travel", "urgent", "planning"])
        spec = {"world": w.to_json(), "target": target["id"], "label": label, "subject": target["subject"]}
        text = f'Add the label "{label}" to the email from {name} with the subject "{target["subject"]}".'
        return _task(self, seed, text, ("gmail",), spec, only=("gmail.search", "gmail.read", "gmail.label"))

    def solution(self, task):
        s = task.spec
        return [AppCall("gmail", "search", {"query": s["subject"]}),
                AppCall("gmail", "label", {"message_id": s["target"], "label": s["label"]}), Finish()]

    def goals(self, task, world, answer):
        m = world.gmail.messages[task.spec["target"]]
        return {"labeled": task.spec["label"] in m.labels}

    def allowed(self, task, c):
        return (c.key == f"gmail/messages/{task.spec['target']}" and c.fields == ("labels",)
                and c.after["labels"] == c.before["labels"] + [task.spec["label"]])


class GmailReplyNotion(WorldFamily):
    name = "gmail_reply_notion"
    domain = "general_agents"
    difficulty = "medium"
    description = "Reply to a colleague's request with a fact looked up on a Notion page."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        ids = wg.Ids()
        w = wg.filler_world(rng, ids, n_mail=4, n_pages=3, n_slack=2, n_courses=1, n_assign=1)
        name, addr = wg.person(rng)
        first = name.split()[0]
        kinds = rng.sample(sorted(wg.FACTS), 3)
        values = {k: rng.choice(wg.FACTS[k]).format(n=rng.randint(10, 99), d=rng.randint(1, 28)) for k in kinds}
        fact = kinds[0]
        team = rng.choice(["Atlas", "Borealis", "Cobalt", "Delta", "Ember"])
        title = f"{team} team info"
        pg = wg.page(ids, title, [f"The {k} is {v}." for k, v in values.items()])
        w.notion.add_page(pg)
        req = wg.mail(ids, 0, w.date_of(0), addr, f"Quick question: {fact}",
                      f"Hi! Could you send me the {fact} for the {team} team? Thanks, {first}")
        w.gmail.deliver(req)
        spec = {"world": w.to_json(), "request": req["id"], "sender": addr, "first": first,
                "fact": fact, "value": values[fact], "page": pg["id"], "title": title,
                "subject": req["subject"]}
        text = (f"{name} emailed you asking for the {fact}. Look it up on the Notion page "
                f'"{title}" and reply to their email with it.')
        return _task(self, seed, text, ("gmail", "notion"), spec)

    def solution(self, task):
        s = task.spec
        return [
            AppCall("gmail", "search", {"query": f"from:{s['sender'].split('@')[0]}"}),
            AppCall("gmail", "read", {"message_id": s["request"]}),
            AppCall("notion", "search", {"query": s["title"]}),
            AppCall("notion", "get_page", {"page_id": s["page"]}),
            AppCall("gmail", "send", {"to": [s["sender"]], "subject": f"Re: {s['subject']}",
                                      "body": f"Hi {s['first']}, the {s['fact']} is {s['value']}.",
                                      "reply_to": s["request"]}),
            Finish(),
        ]

    def goals(self, task, world, answer):
        s = task.spec
        replies = [m for m in _sent_by_me(world) if m.reply_to == s["request"]]
        return {
            "replied_once": len(replies) == 1,
            "to_sender": bool(replies) and s["sender"] in replies[0].to,
            "has_fact": bool(replies) and s["value"].lower() in replies[0].body.lower(),
        }

    def allowed(self, task, c):
        return c.op == "added" and c.key.startswith("gmail/messages/s") and c.after["reply_to"] == task.spec["request"]


class CanvasSubmitDrafts(WorldFamily):
    name = "canvas_submit_drafts"
    domain = "general_agents"
    difficulty = "medium"
    description = "Submit the assignments of a course due within a week, with text from Notion drafts."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        ids = wg.Ids()
        w = wg.filler_world(rng, ids, n_mail=2, n_pages=2, n_slack=2, n_courses=1, n_assign=1)
        free = [c for c in wg.COURSES if c[0] not in w.canvas.courses]
        cid, cname = rng.choice(free)
        w.canvas.add_course(cid, cname)
        k = rng.randint(2, 4)
        titles = [f"{kind} {n}" for kind, n in rng.sample(
            [(a, b) for a in wg.ASSIGNMENT_KINDS for b in range(1, 10)], k + 2)]
        due_days = [rng.randint(1, 7) for _ in range(k)] + [rng.randint(9, 20) for _ in range(2)]
        targets = []
        for i, (title, due) in enumerate(zip(titles, due_days)):
            a = wg.assignment(rng, ids, posted=-rng.randint(1, 5), due=due, title=title)
            w.canvas.post(cid, a)
            draft = f"{title}: " + rng.choice([
                "my answers are attached below.", "see the worked solutions in this text.",
                f"summary of chapter {rng.randint(1, 12)} with the key results.",
                f"the result is {rng.randint(10, 999)} and the method is explained here."])
            pg = wg.page(ids, f"Draft: {title}", [draft])
            w.notion.add_page(pg)
            if i < k:
                targets.append({"id": a["id"], "title": title, "page": pg["id"], "text": draft})
        spec = {"world": w.to_json(), "course": cid, "targets": targets}
        text = (f"Submit every {cname} assignment that is due within the next 7 days (today is "
                f"{w.date_of(0)}). For each, use the text of the Notion page titled "
                '"Draft: <assignment title>".')
        return _task(self, seed, text, ("canvas", "notion"), spec)

    def solution(self, task):
        s = task.spec
        acts = [AppCall("canvas", "list_courses", {}),
                AppCall("canvas", "list_assignments", {"course_id": s["course"]})]
        for t in s["targets"]:
            acts += [AppCall("notion", "search", {"query": f"Draft: {t['title']}"}),
                     AppCall("notion", "get_page", {"page_id": t["page"]}),
                     AppCall("canvas", "submit", {"course_id": s["course"], "assignment_id": t["id"],
                                                  "text": t["text"]})]
        return acts + [Finish()]

    def goals(self, task, world, answer):
        c = world.canvas.courses[task.spec["course"]]
        return {f"submitted {t['title']}": c.assignments[t["id"]].submission == t["text"]
                for t in task.spec["targets"]}

    def allowed(self, task, c):
        keys = {f"canvas/assignments/{task.spec['course']}/{t['id']}" for t in task.spec["targets"]}
        return c.key in keys and set(c.fields) <= {"submission", "submitted_on"}


class SlackTodosToNotion(WorldFamily):
    name = "slack_todos_to_notion"
    domain = "general_agents"
    difficulty = "medium"
    description = 'Copy every "TODO:" message of a Slack channel into a Notion to-do list.'

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        ids = wg.Ids()
        w = wg.filler_world(rng, ids, n_mail=2, n_pages=2, n_slack=2, n_courses=1, n_assign=1)
        channel, topic = rng.choice(wg.CHANNELS[3:])
        w.slack.add_channel(channel, topic)
        items = rng.sample([
            "book the venue", "update the budget sheet", "email the vendor", "review the design doc",
            "fix the login bug", "order new laptops", "draft the press note", "collect survey results",
            "renew the domain", "plan the demo"], rng.randint(2, 5))
        chatter = ["Morning all!", "Who has the slides?", "Great work yesterday.",
                   "the TODO: list is getting long", "Can we move standup?"]
        msgs = [f"TODO: {it}" for it in items] + rng.sample(chatter, 3)
        rng.shuffle(msgs)
        for text in msgs:
            w.slack.deliver(channel, wg.slack_msg(ids, 0, rng.choice(wg.FIRST).lower(), text))
        title = f"{channel.split('-')[1].capitalize()} tasks"
        pg = wg.page(ids, title, ["Open tasks for the project."], todo=["set up the repo"])
        w.notion.add_page(pg)
        wg.finish_ids(w, ids)
        spec = {"world": w.to_json(), "channel": channel, "items": items, "page": pg["id"], "title": title}
        order = [m[len("TODO: "):] for m in msgs if m.startswith("TODO: ")]
        spec["order"] = order
        text = (f'Add every message in the #{channel} Slack channel that starts with "TODO:" to the Notion '
                f'page "{title}" as a to-do item, without the "TODO:" prefix.')
        return _task(self, seed, text, ("slack", "notion"), spec)

    def solution(self, task):
        s = task.spec
        acts = [AppCall("slack", "read", {"channel": s["channel"]}),
                AppCall("notion", "search", {"query": s["title"]})]
        acts += [AppCall("notion", "append_block", {"page_id": s["page"], "text": it, "type": "todo"})
                 for it in s["order"]]
        return acts + [Finish()]

    def goals(self, task, world, answer):
        blocks = world.notion.pages[task.spec["page"]].blocks
        todos = [b.text.strip() for b in blocks if b.type == "todo"]
        return {f"todo {it!r}": todos.count(it) == 1 for it in task.spec["items"]}

    def allowed(self, task, c):
        return (c.op == "added" and c.key.startswith(f"notion/blocks/{task.spec['page']}/")
                and c.after["type"] == "todo" and c.after["text"].strip() in task.spec["items"])


MENTION = re.compile(r"(?<![\w@])@me\b")
ROUTINE = """For the next {days} days you run my inbox, Slack and coursework. Today is {date} (day 0).
Every day, for what arrived that day:
1. Label every email sent from an @{school} address with "school".
2. Archive every email whose subject starts with "[Newsletter]".
3. In Slack, react with white_check_mark to every message that mentions @me.
4. Submit every new Canvas assignment on the day it appears, with the text of the Notion page titled "Draft: <assignment title>".
Leave everything else as it is. Then call clock.advance_day to go to the next day. After handling day {days}, finish."""


class DailyAssistant(WorldFamily):
    """The multi-day routine; `days` and the event rates set the length."""

    domain = "general_agents"

    def __init__(self, name: str, difficulty: str, days: int, mails: int, messages: int, p_assign: float):
        self.name, self.difficulty = name, difficulty
        self.days, self.mails, self.messages, self.p_assign = days, mails, messages, p_assign
        self.description = f"Run a daily inbox/Slack/coursework routine over {days} simulated days."

    def _day_events(self, rng: random.Random, ids: wg.Ids, day: int, courses, counter) -> list[Event]:
        date = wg.date_of(day)
        ev: list[Event] = []
        for _ in range(rng.randint(max(1, self.mails - 2), self.mails + 1)):
            kind = rng.choices(["school", "news", "work", "tricky"], [3, 2, 3, 1])[0]
            if kind == "school":
                prof = f"{rng.choice(wg.FIRST).lower()}.{rng.choice(wg.LAST).lower()}@{wg.SCHOOL}"
                m = wg.mail(ids, day, date, prof, rng.choice(
                    ["Office hours moved", "Exam room change", "Lecture notes posted", "Grading update"]),
                    "Please see the course page for details.")
            elif kind == "news":
                m = wg.mail(ids, day, date, f"news@{rng.choice(['techweekly.io', 'digest.com'])}",
                            f"[Newsletter] {rng.choice(wg.NEWSLETTERS)} #{rng.randint(1, 300)}",
                            "This week's top stories.")
            elif kind == "work":
                _, addr = wg.person(rng)
                m = wg.mail(ids, day, date, addr, f"Re: {rng.choice(wg.TOPICS)}", "See my comments inline.")
            else:
                _, addr = wg.person(rng)
                m = wg.mail(ids, day, date, addr, rng.choice(
                    ["Re: [Newsletter] worth reading?", "Forwarding a note from stateu.edu"]),
                    f"My old address was someone@{wg.SCHOOL}, ignore it.")
            m["kind"] = kind
            ev.append(Event(day, "gmail", m))
        for _ in range(rng.randint(max(1, self.messages - 1), self.messages + 1)):
            ch = rng.choice(["general", "random", "project-atlas"])
            who = rng.choice(wg.FIRST).lower()
            text = rng.choice([
                f"@me can you check the {rng.choice(wg.TOPICS)}?", f"thanks @me for the {rng.choice(wg.TOPICS)}!",
                f"@{rng.choice(wg.FIRST).lower()} please review the {rng.choice(wg.TOPICS)}",
                f"Reminder: {rng.choice(wg.TOPICS)} at {rng.randint(9, 17)}:00",
                "send the deck to @meera when ready"])
            ev.append(Event(day, "slack", {"channel": ch, **wg.slack_msg(ids, day, who, text)}))
        if rng.random() < self.p_assign:
            cid = rng.choice(courses)
            counter[0] += 1
            title = f"{rng.choice(wg.ASSIGNMENT_KINDS)} #{counter[0]}"
            a = wg.assignment(rng, ids, posted=day, due=day + rng.randint(3, 7), title=title)
            draft = f"Answer for {title}: {rng.choice(['see the derivation', 'summary attached', 'final numbers'])} ({rng.randint(100, 999)})."
            ev.append(Event(day, "canvas", {"course_id": cid, **a}))
            ev.append(Event(day, "notion", wg.page(ids, f"Draft: {title}", [draft], created=wg.date_of(day))))
        return ev

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        ids = wg.Ids()
        w = wg.filler_world(rng, ids, n_mail=2, n_pages=2, n_slack=2, n_courses=2, n_assign=1)
        courses = sorted(w.canvas.courses)
        counter = [0]
        events = []
        for day in range(self.days + 1):
            events += self._day_events(rng, ids, day, courses, counter)
        # Day 0's events are already there at the start; later days arrive with advance_day.
        for e in events:
            if e.day == 0:
                w.apply(Event(0, e.app, {k: v for k, v in e.data.items() if k != "kind"}))
        wg.add_timeline(w, [Event(e.day, e.app, {k: v for k, v in e.data.items() if k != "kind"})
                            for e in events if e.day > 0])
        wg.finish_ids(w, ids)
        spec = {"world": w.to_json(), "days": self.days, **self._targets(events)}
        text = ROUTINE.format(days=self.days, date=w.date_of(0), school=wg.SCHOOL)
        return _task(self, seed, text, ("gmail", "slack", "canvas", "notion", "clock"), spec)

    @staticmethod
    def _targets(events: list[Event]) -> dict:
        school, news, mentions, assignments, plan = [], [], [], [], []
        drafts = {}
        for e in events:
            if e.app == "notion":
                drafts[e.data["title"][len("Draft: "):]] = (e.data["id"], e.data["blocks"][0]["text"])
        for e in events:
            d = e.data
            if e.app == "gmail":
                rule = {"school": "label", "news": "archive"}.get(d["kind"])
                if rule == "label":
                    school.append(d["id"])
                elif rule == "archive":
                    news.append(d["id"])
                plan.append({"day": e.day, "mail": d["id"], "rule": rule})
            elif e.app == "slack":
                hit = bool(MENTION.search(d["text"]))
                if hit:
                    mentions.append(f"{d['channel']}/{d['ts']}")
                plan.append({"day": e.day, "channel": d["channel"], "ts": d["ts"], "mention": hit})
            elif e.app == "canvas":
                page_id, text = drafts[d["title"]]
                item = {"day": e.day, "course": d["course_id"], "assignment": d["id"], "title": d["title"],
                        "page": page_id, "text": text}
                assignments.append(item)
                plan.append(item)
        return {"school": school, "news": news, "mentions": mentions, "assignments": assignments, "plan": plan}

    def solution(self, task):
        s = task.spec
        acts: list = []
        for day in range(s["days"] + 1):
            items = [p for p in s["plan"] if p["day"] == day]
            if day > 0:
                acts.append(AppCall("clock", "advance_day", {}))
            acts.append(AppCall("gmail", "search", {"received": wg.date_of(day), "limit": 50}))
            for p in items:
                if "mail" in p and p["rule"] == "label":
                    acts.append(AppCall("gmail", "label", {"message_id": p["mail"], "label": "school"}))
                elif "mail" in p and p["rule"] == "archive":
                    acts.append(AppCall("gmail", "archive", {"message_id": p["mail"]}))
            for ch in sorted({p["channel"] for p in items if "channel" in p}):
                acts.append(AppCall("slack", "read", {"channel": ch, "day": day}))
                acts += [AppCall("slack", "react", {"channel": ch, "ts": p["ts"], "emoji": "white_check_mark"})
                         for p in items if p.get("channel") == ch and p["mention"]]
            for p in items:
                if "assignment" in p:
                    acts += [AppCall("canvas", "list_assignments", {"course_id": p["course"], "status": "open"}),
                             AppCall("notion", "search", {"query": f"Draft: {p['title']}"}),
                             AppCall("notion", "get_page", {"page_id": p["page"]}),
                             AppCall("canvas", "submit", {"course_id": p["course"], "assignment_id": p["assignment"],
                                                          "text": p["text"]})]
        return acts + [Finish()]

    def goals(self, task, world, answer):
        s = task.spec
        g = world.gmail.messages
        msgs = {f"{c.name}/{m.ts}": m for c in world.slack.channels.values() for m in c.messages}
        ok_sub = all(
            (a := world.canvas.courses[x["course"]].assignments.get(x["assignment"])) is not None
            and a.submission == x["text"] and a.submitted_on == wg.date_of(x["day"])
            for x in s["assignments"])
        return {
            "school_mail_labeled": all(i in g and "school" in g[i].labels for i in s["school"]),
            "newsletters_archived": all(i in g and g[i].folder == "archive" for i in s["news"]),
            "mentions_acknowledged": all(k in msgs and wg.SLACK_USER in msgs[k].reactions.get("white_check_mark", [])
                                         for k in s["mentions"]),
            "assignments_submitted_same_day": ok_sub,
            "stopped_after_last_day": world.day == s["days"],
        }

    def allowed(self, task, c):
        s = task.spec
        parts = c.key.split("/")
        if c.op != "updated":
            return False
        if c.collection == "gmail/messages":
            if parts[2] in s["school"]:
                return c.fields == ("labels",) and c.after["labels"] == ["school"]
            if parts[2] in s["news"]:
                return c.fields == ("folder",) and c.after["folder"] == "archive"
            return False
        if c.collection == "slack/messages":
            return (f"{parts[2]}/{parts[3]}" in s["mentions"] and c.fields == ("reactions",)
                    and c.after["reactions"] == {"white_check_mark": [wg.SLACK_USER]})
        if c.collection == "canvas/assignments":
            return (any(x["assignment"] == parts[3] for x in s["assignments"])
                    and set(c.fields) <= {"submission", "submitted_on"})
        return False


FAMILIES = [
    SlackPost(), GmailLabel(), GmailReplyNotion(), CanvasSubmitDrafts(), SlackTodosToNotion(),
    DailyAssistant("assistant_3day", "medium", days=3, mails=4, messages=2, p_assign=0.7),
    DailyAssistant("assistant_2week", "hard", days=14, mails=5, messages=3, p_assign=0.7),
    DailyAssistant("assistant_term", "marathon", days=90, mails=6, messages=4, p_assign=0.8),
]
