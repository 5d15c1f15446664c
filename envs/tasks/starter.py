"""Starter families: the lowest rungs of the RL task ladder, one per skill a 2–3M-parameter policy can
reach after a short SFT (docs/log/posttrain.md, the ladder). Every one is a full envs task — harness
prompt, tools, budget, real verifier — with a short answer or a single tool call:

| family          | domain         | difficulty | tools       | expert calls | what it takes                 |
|-----------------|----------------|------------|-------------|--------------|-------------------------------|
| echo_word       | general_tasks  | easy       | finish only | 1            | copy one word from the task   |
| compare_numbers | general_tasks  | easy       | finish only | 1            | the larger of two 3-digit ints|
| compare_numbers_close | general_tasks | medium | finish only | 1          | the same, the hundreds shared  |
| slack_ping      | general_agents | easy       | slack       | 2            | one post: channel + one word  |
| slack_ping_pick | general_agents | medium     | slack       | 2            | the same, the first or second of two words |
| write_constant  | coding_agents  | easy       | files, run  | 2            | a one-line function           |
| write_answer    | coding_agents  | easy       | files, run  | 2            | write_constant named answer   |
| write_number    | coding_agents  | easy       | files, run  | 2            | `answer()` returning a number |

compare_numbers_close is the hard split of the compare_numbers specialists (issue 40 item 5: harder
instances of the trained family): the same question, the two numbers share their hundreds digit and,
in half the tasks, their tens digit too, so the answer turns on the last one or two digits. It is no
SFT family (datagen.sft.SFT_FAMILIES), only a place to score.

slack_ping_pick is slack_ping with a choice in it (a rung for general_agents when SFT taught slack_ping
too well for RL to sharpen: 0.87 pass@1 on 256 held-out tasks at high, docs/log/rl.md 2026-12-07): the task
names two of the words and asks for the first or the second. That policy, never trained on it, scores
pass@1 0.16 / 0.13 / 0.37 and pass@8 0.50 / 0.56 / 0.63 at low / high / max (16 tasks × 8 samples): it
sometimes reads "first"/"second", which RL can sharpen. It is no SFT family; the verifier is
slack_ping's (the one post must carry exactly the asked word, so the other word, or both, fail).

write_answer is write_constant with the name fixed (the tiny ladder's coding rung),
and write_number the rung below it: the file and the function (`answer()`, no argument)
are always the same, so only the number is copied from the prompt. The tiny SFT policy wrote
write_constant's call format and file right but copied the function's name, its argument and its
operator wrong (3 % pass at low effort, docs/log/rl.md, 2026-12-02); the number has three digits, so
no fixed guess passes more than one task in 900.

Held out in instruction: the RL ladder scores a specialist on ≥ 256 tasks whose instructions differ
from its ≥ 256 RL prompts (k3model.train.ladder.heldout_tasks), so a rung needs ≥ 512 distinct
instructions. slack_ping and write_constant / write_answer draw theirs from a grid of N cells

    slack_ping:      word (20: WORDS) × channel (3) × phrasing (10: PING_PHRASINGS)         N = 600
    slack_ping_pick: word pair (20 × 19) × which (2) × channel (3) × phrasing (3)           N = 6,840
    write_constant:  name (5) × kind (3: k, x + k, x · k) × k ∈ [2, 99] × phrasing (3)      N = 4,410
    write_answer:    write_constant with one name                                          N = 882

and a seed picks cell π(seed mod N), π a fixed pseudo-random permutation of range(N)
(`grid_point`): any N consecutive seeds give N different instructions (random draws would repeat
one in 256 seeds with probability 1 − e^(−256²/2N), 1.00 at N = 600), and every cell is as likely.
The rest of a task (the filler world, the hidden tests' arguments) still comes from
random.Random(seed). The grid varies the wording, not the words, channels or numbers: the tiny SFT
policy holds WORDS, the three channels and two-digit numbers as lists and writes one of them for
anything else (docs/log/envs.md, 2026-12-06), so new content would be a new skill for it rather than
the edge of its competence.

The verifiers are the ones of the families they shrink (general.py's answer check with the
unchanged-workspace check, SlackPost's world diff, CodingFamily's jailed hidden tests); nothing is
loosened. The words are drawn from a list disjoint from what the random policy of envs.experts
writes, and the numbers have three digits, so a random or empty policy scores 0
(tests/envs/test_envs_starter.py).
"""

from __future__ import annotations

import functools
import math
import random

from envs.actions import AppCall, Finish, Write
from envs.apps import World
from envs.harnesses.base import ToolSet
from envs.tasks import worldgen as wg
from envs.tasks.assistant import SlackPost, budget
from envs.tasks.base import Family, Final, Task, files_changed, verdict
from envs.tasks.coding import CodingFamily, case
from envs.tasks.general import FINISH_NOTE, _answer_goal

WORDS = ("falcon", "maple", "cobalt", "river", "orbit", "lantern", "quartz", "meadow", "harbor", "ember",
         "glacier", "violet", "summit", "copper", "willow", "thunder", "saffron", "pebble", "canyon", "juniper")


# How slack_ping and write_constant / write_answer say their task: the first is the one the families
# had alone. Every phrasing names the same parts (word and channel; name, signature and body), in
# another order or wording, so the copy is the same skill.
PING_PHRASINGS = (
    'Post the word "{word}" in the #{channel} Slack channel.',
    'In the #{channel} Slack channel, post the word "{word}".',
    'Post "{word}" in #{channel} on Slack.',
    'Send the word "{word}" to the #{channel} channel on Slack.',
    'Please post the word "{word}" in #{channel}.',
    'On Slack, post "{word}" to the #{channel} channel.',
    'Write the word "{word}" as a message in the #{channel} Slack channel.',
    'Post a message in the #{channel} Slack channel that says "{word}".',
    'The #{channel} Slack channel needs the word "{word}": post it there.',
    'Post one word in the #{channel} Slack channel: "{word}".')
PICK_PHRASINGS = (
    'Of the words "{a}" and "{b}", post the {which} in the #{channel} Slack channel.',
    'Post the {which} of these two words in the #{channel} Slack channel: "{a}", "{b}".',
    'In the #{channel} Slack channel, post the {which} word of "{a}" and "{b}".')
WRITE_PHRASINGS = (
    "Create a file solution.py that defines {signature}, a function that {does}. Hidden tests will check it.",
    "Write solution.py with a function {signature} that {does}. Hidden tests will check it.",
    "In a new file solution.py, define {signature} so that it {does}. Hidden tests will check it.")


@functools.lru_cache(maxsize=None)
def _permutation(salt: str, n: int) -> tuple[int, ...]:
    return tuple(random.Random(f"{salt}/{n}").sample(range(n), n))


def grid_point(salt: str, seed: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The seed's cell (one index per axis, the first axis varying fastest) of a grid of
    N = Π sizes: π(seed mod N) in mixed radix, π a permutation of range(N) fixed by `salt` and N.
    Injective on any N consecutive seeds."""
    if not sizes or min(sizes) < 1:
        raise ValueError(f"grid sizes must be ≥ 1 per axis, got {sizes}")
    i = _permutation(salt, math.prod(sizes))[seed % math.prod(sizes)]
    out = []
    for size in sizes:
        i, digit = divmod(i, size)
        out.append(digit)
    return tuple(out)


class _AnswerFamily(Family):
    domain = "general_tasks"
    difficulty = "easy"

    def _task(self, seed: int, question: str, answer: str, extra: dict | None = None) -> Task:
        t = Task(self.name, seed, self.domain, self.difficulty, question + FINISH_NOTE, ToolSet(), 0, 0,
                 {"answer": answer, **(extra or {})})
        return budget(t, 1)

    def solution(self, task):
        return [Finish(task.spec["answer"])]

    def verify(self, task: Task, final: Final):
        return verdict(_answer_goal(task, final.answer), files_changed(final.sandbox, {}), [], final.finished)


class EchoWord(_AnswerFamily):
    name = "echo_word"
    description = "Answer with the one word the task names (a copy from the prompt)."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        word = rng.choice(WORDS)
        question = rng.choice([f'The password is "{word}". What is the password?',
                               f'Repeat this word: "{word}".',
                               f'{rng.choice(wg.FIRST)} picked the word "{word}". Which word did they pick?'])
        return self._task(seed, question, word)


class CompareNumbers(_AnswerFamily):
    name = "compare_numbers"
    description = "Answer with the larger (or smaller) of two three-digit numbers."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        a, b = rng.sample(range(100, 1000), 2)
        larger = rng.random() < 0.5
        word = "larger" if larger else "smaller"
        answer = max(a, b) if larger else min(a, b)
        return self._task(seed, f"Which number is {word}: {a} or {b}?", str(answer),
                          {"numbers": [a, b], "larger": larger})


class CompareNumbersClose(CompareNumbers):
    name = "compare_numbers_close"
    difficulty = "medium"
    description = ("Answer with the larger (or smaller) of two three-digit numbers that share their hundreds "
                   "digit (half the time their tens digit too).")

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        hundreds = rng.randrange(1, 10)
        if rng.random() < 0.5:
            tens = rng.randrange(10)
            x, y = (10 * tens + u for u in rng.sample(range(10), 2))
        else:
            x, y = rng.sample(range(100), 2)
        a, b = 100 * hundreds + x, 100 * hundreds + y
        larger = rng.random() < 0.5
        word = "larger" if larger else "smaller"
        answer = max(a, b) if larger else min(a, b)
        return self._task(seed, f"Which number is {word}: {a} or {b}?", str(answer),
                          {"numbers": [a, b], "larger": larger})


class SlackPing(SlackPost):
    name = "slack_ping"
    difficulty = "easy"
    description = "Post one given word in a given Slack channel (slack_post with a one-word message)."

    def generate(self, seed: int) -> Task:
        w, channels = self._world(seed)
        word_i, channel_i, say_i = grid_point(self.name, seed, (len(WORDS), len(channels), len(PING_PHRASINGS)))
        channel, text = channels[channel_i], WORDS[word_i]
        return self._ping(seed, w, channel, text, PING_PHRASINGS[say_i].format(word=text, channel=channel))

    @staticmethod
    def _world(seed: int) -> tuple[World, list[str]]:
        """A small filler world and its Slack channels, sorted."""
        w = wg.filler_world(random.Random(seed), wg.Ids(), n_mail=1, n_pages=1, n_slack=3, n_courses=1, n_assign=1)
        return w, sorted(w.slack.channels)

    def _ping(self, seed: int, w: World, channel: str, text: str, instruction: str, **spec) -> Task:
        """The task: post exactly `text` in `channel` (slack_post's verifier), two turns."""
        t = Task(self.name, seed, self.domain, self.difficulty, instruction,
                 ToolSet(apps=("slack",), only=("slack.list_channels", "slack.post")), 0, 0,
                 {"world": w.to_json(), "channel": channel, "text": text, **spec})
        return budget(t, 2)


class SlackPingPick(SlackPing):
    name = "slack_ping_pick"
    difficulty = "medium"
    description = "Post the first or the second of two given words in a given Slack channel (slack_ping with a choice)."

    def generate(self, seed: int) -> Task:
        w, channels = self._world(seed)
        a_i, b_off, which, channel_i, say_i = grid_point(self.name, seed, (len(WORDS), len(WORDS) - 1, 2,
                                                                           len(channels), len(PICK_PHRASINGS)))
        a, b = WORDS[a_i], WORDS[(a_i + 1 + b_off) % len(WORDS)]
        channel, text = channels[channel_i], (a, b)[which]
        instruction = PICK_PHRASINGS[say_i].format(a=a, b=b, which=("first", "second")[which], channel=channel)
        return self._ping(seed, w, channel, text, instruction, words=[a, b])


class WriteConstant(CodingFamily):
    name = "write_constant"
    difficulty = "easy"
    description = "Write solution.py with a one-line function: a constant, or its argument plus or times k."
    names = ("value", "answer", "result", "magic", "score")
    operators = {"+": "plus", "*": "times"}
    k_range = (2, 99)

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        lo, hi = self.k_range
        name_i, kind, k_i, say_i = grid_point(self.name, seed, (len(self.names), 1 + len(self.operators),
                                                                 hi - lo + 1, len(WRITE_PHRASINGS)))
        name, k = self.names[name_i], lo + k_i
        if kind == 0:
            instruction, params, body, cases = (f"returns the number {k}", "", f"return {k}",
                                                [case("test_solution_hidden::test_1", f"from solution import {name}",
                                                      f"{name}()", k)])
        else:
            op = list(self.operators)[kind - 1]
            instruction = f"returns x {self.operators[op]} {k}"
            params, body = "x", f"return x {op} {k}"
            value = {"+": lambda x: x + k, "*": lambda x: x * k}[op]
            cases = [case(f"test_solution_hidden::test_{i + 1}", f"from solution import {name}", f"{name}({x})",
                          value(x)) for i, x in enumerate(rng.sample(range(-50, 100), 4))]
        text = WRITE_PHRASINGS[say_i].format(signature=f"{name}({params})", does=instruction)
        return self._finish_task(seed, text, {}, cases, [], {"source": f"def {name}({params}):\n    {body}\n"})

    def solution(self, task):
        return [Write("solution.py", task.spec["source"]), Finish()]


class WriteAnswer(WriteConstant):
    name = "write_answer"
    description = "write_constant with the function always named answer: a constant, or x plus or times k."
    names = ("answer",)


class WriteNumber(CodingFamily):
    name = "write_number"
    difficulty = "easy"
    description = "Write solution.py with answer(), a function that returns a given three-digit number."

    def generate(self, seed: int) -> Task:
        k = random.Random(seed).randint(100, 999)
        cases = [case("test_solution_hidden::test_1", "from solution import answer", "answer()", k)]
        text = (f"Create a file solution.py that defines answer(), a function that returns the number {k}. "
                "Hidden tests will check it.")
        return self._finish_task(seed, text, {}, cases, [], {"source": f"def answer():\n    return {k}\n",
                                                             "number": k})

    def solution(self, task):
        return [Write("solution.py", task.spec["source"]), Finish()]


FAMILIES = [EchoWord(), CompareNumbers(), CompareNumbersClose(), SlackPing(), SlackPingPick(), WriteConstant(), WriteAnswer(), WriteNumber()]
