"""Answer tasks (domain general_tasks): a question, a few lookups at most, an answer in `finish`.

| family           | difficulty | tools          | expert calls |
|------------------|------------|----------------|--------------|
| arith_word       | easy       | finish only    | 1            |
| file_lookup      | easy       | files          | 2            |
| canvas_due_date  | easy       | canvas         | 3            |
| file_aggregate   | medium     | files          | 2 (search)   |

The verifier compares the normalized answer (case, whitespace, "$", "," and a trailing "." ignored;
numbers compared as numbers) and checks that nothing in the workspace or the world changed.
"""

from __future__ import annotations

import random

from envs.actions import AppCall, Finish, Read, Search
from envs.harnesses.base import ToolSet
from envs.tasks import worldgen as wg
from envs.tasks.assistant import budget
from envs.tasks.base import Family, Final, Task, WorldFamily, files_changed, normalize_answer, verdict

FINISH_NOTE = " Finish with only the answer."


def _answer_goal(task: Task, answer: str | None) -> dict[str, bool]:
    return {"answer_correct": answer is not None and normalize_answer(answer) == normalize_answer(task.spec["answer"])}


class ArithWord(Family):
    name = "arith_word"
    domain = "general_tasks"
    difficulty = "easy"
    description = "A one-step arithmetic word problem answered with the finish tool."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        name = rng.choice(wg.FIRST)
        kind = rng.randrange(6)
        if kind == 0:
            a, p, b, q = rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 6), rng.randint(1, 5)
            qtext, ans = (f"{name} buys {a} notebooks at ${p} each and {b} pens at ${q} each. "
                          f"How many dollars does {name} spend?", a * p + b * q)
        elif kind == 1:
            v, t = rng.randint(40, 120), rng.randint(2, 6)
            qtext, ans = f"A train travels at {v} km/h for {t} hours. How many kilometres does it cover?", v * t
        elif kind == 2:
            a, b, c = rng.randint(10, 40), rng.randint(1, 9), rng.randint(1, 20)
            qtext, ans = (f"{name} has {a} apples, gives away {b}, then buys {c} more. "
                          f"How many apples does {name} have now?", a - b + c)
        elif kind == 3:
            a, b, c = rng.randint(2, 8), rng.randint(4, 12), rng.randint(1, 9)
            qtext, ans = f"A box holds {a} rows of {b} eggs. {c} eggs break. How many eggs are left?", a * b - c
        elif kind == 4:
            n = rng.randint(5, 60)
            qtext, ans = f"What is the sum of all whole numbers from 1 to {n}?", n * (n + 1) // 2
        else:
            p, d = rng.randint(5, 30), rng.randint(3, 12)
            qtext, ans = (f"{name} reads {p} pages a day and finishes a book in exactly {d} days. "
                          "How many pages does the book have?", p * d)
        t = Task(self.name, seed, self.domain, self.difficulty, qtext + FINISH_NOTE, ToolSet(), 0, 0,
                 {"answer": str(ans)})
        return budget(t, 1)

    def solution(self, task):
        return [Finish(task.spec["answer"])]

    def verify(self, task: Task, final: Final):
        return verdict(_answer_goal(task, final.answer), files_changed(final.sandbox, {}), [], final.finished)


ITEMS = ["bolts", "nuts", "washers", "hinges", "brackets", "screws", "rivets", "springs", "clamps",
         "gaskets", "pulleys", "valves", "fuses", "cables"]
LOCATIONS = ["A1", "A2", "B1", "B3", "C2", "D4"]


class FileLookup(Family):
    name = "file_lookup"
    domain = "general_tasks"
    difficulty = "easy"
    description = "Read one CSV file in the workspace and report a value from it."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        rows = rng.sample(ITEMS, rng.randint(5, 9))
        qty = {it: rng.randint(0, 500) for it in rows}
        lines = ["item,quantity,location"] + [f"{it},{qty[it]},{rng.choice(LOCATIONS)}" for it in rows]
        item = rng.choice(rows)
        files = {"inventory.csv": "\n".join(lines) + "\n"}
        text = f"How many {item} are in stock according to inventory.csv?" + FINISH_NOTE
        t = Task(self.name, seed, self.domain, self.difficulty, text, ToolSet(files=True, only=("read", "search")),
                 0, 0, {"files": files, "answer": str(qty[item])})
        return budget(t, 2)

    def solution(self, task):
        return [Read("inventory.csv"), Finish(task.spec["answer"])]

    def verify(self, task, final):
        return verdict(_answer_goal(task, final.answer), files_changed(final.sandbox, task.spec["files"]), [],
                       final.finished)


class FileAggregate(Family):
    name = "file_aggregate"
    domain = "general_tasks"
    difficulty = "medium"
    description = "Sum one product's units over several CSV files in a folder."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        products = rng.sample(ITEMS, 5)
        target = products[0]
        files, total = {}, 0
        for region in rng.sample(["north", "south", "east", "west", "central", "coast", "valley", "hills"],
                                 rng.randint(3, 7)):
            rows = ["product,units"]
            for p in products:
                for _ in range(rng.randint(0, 2)):
                    u = rng.randint(1, 90)
                    rows.append(f"{p},{u}")
                    total += u if p == target else 0
            files[f"sales/{region}.csv"] = "\n".join(rows) + "\n"
        text = f"What is the total number of {target} units sold across all CSV files in sales/?" + FINISH_NOTE
        t = Task(self.name, seed, self.domain, self.difficulty, text, ToolSet(files=True), 0, 0,
                 {"files": files, "answer": str(total), "product": target})
        return budget(t, 4)

    def solution(self, task):
        return [Search(f"^{task.spec['product']},", "sales"), Finish(task.spec["answer"])]

    def verify(self, task, final):
        return verdict(_answer_goal(task, final.answer), files_changed(final.sandbox, task.spec["files"]), [],
                       final.finished)


class CanvasDueDate(WorldFamily):
    name = "canvas_due_date"
    domain = "general_tasks"
    difficulty = "easy"
    description = "Look up an assignment's due date on Canvas."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        ids = wg.Ids()
        w = wg.filler_world(rng, ids, n_mail=1, n_pages=1, n_slack=1, n_courses=2, n_assign=3)
        # Titles can repeat across courses (the course name in the question disambiguates) but the
        # question only ever names a title that is unique within its course.
        choices = []
        for cid, course in sorted(w.canvas.courses.items()):
            titles = [x.title for x in course.assignments.values()]
            choices += [(cid, x) for x in sorted(course.assignments.values(), key=lambda x: x.id)
                        if titles.count(x.title) == 1]
        cid, a = rng.choice(choices)
        course = w.canvas.courses[cid]
        text = f'When is "{a.title}" for {course.name} due? Answer with the date as YYYY-MM-DD.' + FINISH_NOTE
        t = Task(self.name, seed, self.domain, self.difficulty, text, ToolSet(apps=("canvas",), only=("canvas.list_courses", "canvas.list_assignments", "canvas.get_assignment")), 0, 0,
                 {"world": w.to_json(), "answer": a.due, "course": cid})
        return budget(t, 3)

    def solution(self, task):
        return [AppCall("canvas", "list_courses", {}),
                AppCall("canvas", "list_assignments", {"course_id": task.spec["course"]}),
                Finish(task.spec["answer"])]

    def goals(self, task, world, answer):
        return _answer_goal(task, answer)


FAMILIES = [ArithWord(), FileLookup(), CanvasDueDate(), FileAggregate()]
