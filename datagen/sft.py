"""SFT demonstrations at three reasoning efforts, from the scripted experts of `envs` (DESIGN.md §1, §4).

Each row is one episode of the expert (`envs.experts.demonstration`: the gold actions written in the
harness's own syntax, each observation produced by the real environment, verifier reward 1) on one
task, rendered as one token sequence:

    <|bos|><|system|><|effort_E|>{first observation: harness prompt, tools, task}<|end|>
    <|effort_E|><|assistant|>[<|think|>{scratchpad}<|think_end|>]{action in the harness's syntax}<|end|>
    <|tool_result|>{observation}<|tool_result_end|>
    <|effort_E|><|assistant|> …                         one assistant turn per expert call
    … the last assistant turn calls the finish tool; its observation is not part of the row

`loss_mask[t] = 1` exactly on the model's own tokens — each turn's scratchpad, action and `<|end|>`
(`<|assistant|>` is written by the caller, as a rollout does) — so the loss never trains the model to
predict prompts or tool results. Each segment is encoded once with the project's tokenizer and the ids
concatenated: the ids stored are the ids trained on, and special tokens are single ids whatever the
text around them. Nothing downstream re-tokenizes decoded text (BPE is not a bijection; TRL #5224).

Effort (the control token `<|effort_low|>`, `<|effort_high|>` or `<|effort_max|>` after `<|system|>`,
and again right before every `<|assistant|>`: a 2–3M-parameter model trained for a few minutes does
not carry a token from hundreds of positions back — with the tag only at the start, the tiny SFT
policy opens a scratchpad at low effort on every turn (docs/log/posttrain.md) — so the tag sits where
the choice is made):

- low: no scratchpad; every turn is the call alone.
- high: a scratchpad on the first turn (the plan: which tools, in order), on the turns that need
  work, given at the level of partial results (per-file subtotals, one line of arithmetic), and on
  the turns that change code (which line a fix replaces).
- max: a scratchpad on every turn: the plan, then each step stated with its arguments before it is
  written in the harness's syntax, and every intermediate result of the work — each addition of a
  running sum, each multiplication split into tens and units.

The work is the computation the answer needs, done in text a small model can copy one step at a
time (carry-free partial products, one addition per line): arithmetic word problems, aggregation
over CSV search hits, a row lookup, course → id → due date. A scratchpad states only what the
instruction or an earlier observation showed: ids are named on the turn that uses them, after the
observation that revealed them. Every result written is checked against the task's answer, so a
changed task template fails generation rather than teaching a wrong sum.

Held-out harness: `HELD_OUT_HARNESS = "openclaw"` is excluded from all of the main lineage's training
(SFT here and RL) and kept for the held-out-harness evaluation (DESIGN.md §5 claim 7). Its XML-style
`<invoke>/<parameter>` calls differ from the four training styles, which write JSON arguments
(`kimi_code`, `claude_code`, `codex`, `hermes`); `hermes`, the default of `envs.make_env`, stays in
training, so code that forgets to pass a harness cannot leak the held-out one.

Tasks: family `f`'s task i has seed `SFT_TASK_SEED_BASE + cfg.seed * SEEDS_PER_CONFIG + i`, far above
the low seeds the RL prompts and the held-out evaluations draw from, so no evaluation task is
demonstrated. A family gets `tasks_per_family` tasks, or a whole multiple of it where
`family_weights` gives one (its share of the rows). Each task is rendered at every effort in one
harness (round-robin over the training harnesses from a seeded offset per family): the same episode at three efforts shows the model what
the control token changes. Rows longer than `max_tokens` are dropped and counted in the table's
metadata (assistant_3day's 34 turns do not fit a tiny context).

Legend: T tokens of one row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

import pyarrow as pa

import envs
from datagen.io import with_metadata
from datagen.seeding import rng
from datagen.tokenizer import (ASSISTANT, BOS, EFFORT_TOKENS, END_OF_TURN, SYSTEM, THINK, THINK_END,
                               TOOL_RESULT, TOOL_RESULT_END, encode, special_token_ids)
from envs.actions import Action, AppCall, Edit, Finish, Read, Run, Search, Write, kind_of
from envs.apps import World
from envs.experts import demonstration
from envs.tasks import Task, get_family

EFFORTS = ("low", "high", "max")
HELD_OUT_HARNESS = "openclaw"
SFT_TASK_SEED_BASE = 1_000_000
SEEDS_PER_CONFIG = 100_000
# The difficulties whose episodes fit a tiny model's context; hard and marathon run 30-1100 turns.
SFT_DIFFICULTIES = ("easy", "medium")
FORMAT = "k3-sft/2"  # 2: the effort tag before every <|assistant|>


# The default families: the starter rungs of the RL ladder (envs/tasks/starter.py) and, per domain,
# the short original family of its hard split (k3model.train.ladder.HARD_FAMILIES) and one more.
# A tiny SFT budget (a few minutes on two cores) spent on 2,000–3,600-token medium episodes would
# teach none of them (docs/log/posttrain.md).
SFT_FAMILIES = ("echo_word", "compare_numbers", "arith_word", "slack_ping", "slack_post", "gmail_label",
                "write_constant", "write_number", "write_function")


def default_families() -> tuple[str, ...]:
    return SFT_FAMILIES


def all_families() -> tuple[str, ...]:
    """Every family whose episodes fit a tiny model's context (difficulty easy or medium)."""
    return tuple(f for f in envs.list_envs() if envs.env_info(f)["difficulty"] in SFT_DIFFICULTIES)


@dataclass(frozen=True)
class SFTDataConfig:
    seed: int = 0
    tasks_per_family: int = 8  # each task gives one row per effort
    families: tuple[str, ...] | None = None  # None: SFT_FAMILIES (all_families() for every easy/medium one)
    # (family, w) pairs: that family gets w × tasks_per_family tasks (others 1 ×), so w sets its
    # share of the rows; its first tasks_per_family tasks are the same as at w = 1.
    family_weights: tuple[tuple[str, int], ...] = ()
    harnesses: tuple[str, ...] | None = None  # None: every harness but HELD_OUT_HARNESS
    efforts: tuple[str, ...] = EFFORTS
    max_tokens: int = 4096  # longer rows are dropped (and counted in the metadata)

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be ≥ 0, got {self.seed}")
        if self.tasks_per_family < 1 or self.tasks_per_family > SEEDS_PER_CONFIG:
            raise ValueError(f"tasks_per_family must lie in [1, {SEEDS_PER_CONFIG}], got {self.tasks_per_family}")
        if self.max_tokens < 16:
            raise ValueError(f"max_tokens must be ≥ 16, got {self.max_tokens}")
        for effort in self.efforts:
            if effort not in EFFORTS:
                raise ValueError(f"unknown effort {effort!r}: choose from {EFFORTS}")
        if not self.efforts:
            raise ValueError(f"efforts must name at least one of {EFFORTS}")
        for harness in self.harnesses or ():
            if harness not in envs.HARNESSES:
                raise ValueError(f"unknown harness {harness!r}: choose from {envs.HARNESSES}")
            if harness == HELD_OUT_HARNESS:
                raise ValueError(f"harness {HELD_OUT_HARNESS!r} is held out of all main-lineage training for "
                                 "the held-out-harness evaluation (claim 7): drop it from harnesses")
        if self.harnesses is not None and not self.harnesses:
            raise ValueError("harnesses must name at least one harness (or be None for all training ones)")
        known = set(envs.list_envs())
        for family in self.families or ():
            if family not in known:
                raise ValueError(f"unknown task family {family!r}; envs.list_envs() lists them")
        for family, w in self.family_weights:
            if family not in self.resolved_families():
                raise ValueError(f"family_weights names {family!r}, which is not among the families "
                                 f"{self.resolved_families()}: add it to families or drop its weight")
            if not isinstance(w, int) or not 1 <= w * self.tasks_per_family <= SEEDS_PER_CONFIG:
                raise ValueError(f"the weight of {family!r} must be an int with 1 ≤ weight × tasks_per_family ≤ "
                                 f"{SEEDS_PER_CONFIG}, got {w!r}")
        if len(dict(self.family_weights)) != len(self.family_weights):
            raise ValueError(f"family_weights names a family twice: {self.family_weights}")

    def resolved_families(self) -> tuple[str, ...]:
        return self.families if self.families is not None else default_families()

    def resolved_harnesses(self) -> tuple[str, ...]:
        return self.harnesses if self.harnesses is not None else envs.harness_split(HELD_OUT_HARNESS)[0]

    def tasks_of(self, family: str) -> int:
        """How many tasks (one row per effort each) `family` gets."""
        return dict(self.family_weights).get(family, 1) * self.tasks_per_family


# ----------------------------------------------------------------------------------------------
# Scratchpads. A Work object holds, per turn index, the lines max writes and the (fewer) lines high
# writes; the generic part (plan, step statements) is added around it in `scratchpads`.

@dataclass
class Work:
    max_lines: dict[int, list[str]]
    high_lines: dict[int, list[str]]


def _mul(a: int, b: int) -> list[str]:
    """a × b with one factor split into tens and units: 47 × 6 = 40 × 6 + 7 × 6 = 240 + 42 = 282."""
    if a < b:
        a, b = b, a
    if a < 10 or b == 1:
        return [f"{a} × {b} = {a * b}"]
    # Split the factor that has both tens and units (40 × 39 splits the 39).
    split, other = (a, b) if a % 10 else (b, a)
    tens, units = split - split % 10, split % 10
    if tens == 0 or units == 0:
        return [f"{a} × {b} = {a * b}"]
    return [f"{a} × {b} = {tens} × {other} + {units} × {other} = {tens * other} + {units * other} = {a * b}"]


def _add(a: int, b: int) -> str:
    return f"{a} + {b} = {a + b}"


# arith_word's question templates: each gives (max lines, high lines, answer) from the numbers in it.
def _shopping(a: int, p: int, b: int, c: int):
    return ([f"notebooks: {x}" for x in _mul(a, p)] + [f"pens: {x}" for x in _mul(b, c)]
            + [f"total: {_add(a * p, b * c)}"],
            [f"{a} × {p} + {b} × {c} = {a * p} + {b * c} = {a * p + b * c}"], a * p + b * c)


def _distance(v: int, t: int):
    return ["distance = speed × time"] + _mul(v, t), [f"{v} × {t} = {v * t}"], v * t


def _apples(a: int, b: int, c: int):
    return [f"{a} - {b} = {a - b}", _add(a - b, c)], [f"{a} - {b} + {c} = {a - b + c}"], a - b + c


def _eggs(a: int, b: int, c: int):
    return _mul(a, b) + [f"{a * b} - {c} = {a * b - c}"], [f"{a} × {b} - {c} = {a * b - c}"], a * b - c


def _triangle(n: int):
    total = n * (n + 1) // 2
    return ([f"1 + 2 + … + {n} = {n} × {n + 1} / 2"] + _mul(n, n + 1) + [f"{n * (n + 1)} / 2 = {total}"],
            [f"{n} × {n + 1} / 2 = {total}"], total)


def _pages(p: int, d: int):
    return ["pages = pages per day × days"] + _mul(p, d), [f"{p} × {d} = {p * d}"], p * d


ARITH_TEMPLATES: list[tuple[re.Pattern, Callable]] = [
    (re.compile(r"buys (\d+) notebooks at \$(\d+) each and (\d+) pens at \$(\d+) each"), _shopping),
    (re.compile(r"travels at (\d+) km/h for (\d+) hours"), _distance),
    (re.compile(r"has (\d+) apples, gives away (\d+), then buys (\d+) more"), _apples),
    (re.compile(r"holds (\d+) rows of (\d+) eggs\. (\d+) eggs break"), _eggs),
    (re.compile(r"sum of all whole numbers from 1 to (\d+)"), _triangle),
    (re.compile(r"reads (\d+) pages a day and finishes a book in exactly (\d+) days"), _pages),
]


def _arith_work(task: Task) -> Work:
    for pattern, template in ARITH_TEMPLATES:
        m = pattern.search(task.instruction)
        if m:
            max_lines, high_lines, answer = template(*map(int, m.groups()))
            _check(task, answer)
            return Work({0: max_lines}, {0: high_lines})
    raise ValueError(f"arith_word task {task.id} matches no known question template: {task.instruction!r}; "
                     "add it to datagen.sft.ARITH_TEMPLATES")


def _check(task: Task, answer) -> None:
    if str(answer) != str(task.spec["answer"]):
        raise ValueError(f"the scratchpad of {task.id} computes {answer} but the task's answer is "
                         f"{task.spec['answer']}: datagen.sft's work for this family is out of date")


def _csv_rows(text: str) -> list[list[str]]:
    return [line.split(",") for line in text.splitlines()[1:] if line]


def _lookup_work(task: Task) -> Work:
    item = re.search(r"How many (\S+) are in stock", task.instruction).group(1)
    row = next(r for r in _csv_rows(task.spec["files"]["inventory.csv"]) if r[0] == item)
    _check(task, row[1])
    return Work({0: [f"the {item} row is in inventory.csv"],
                 1: [f"row: {','.join(row)}", f"{item}: quantity {row[1]}"]},
                {1: [f"{item} → {row[1]}"]})


def _aggregate_work(task: Task) -> Work:
    product = task.spec["product"]
    # The search lists hits sorted by path, then line: the order the running sum follows.
    per_file = [(path, [int(r[1]) for r in _csv_rows(text) if r[0] == product])
                for path, text in sorted(task.spec["files"].items())]
    values = [v for _, vs in per_file for v in vs]
    _check(task, sum(values))
    plan = {0: [f"search sales/ for the {product} rows, then add their units"]}
    if not values:
        return Work({**plan, 1: [f"no {product} rows: 0 units"]}, {1: ["no rows → 0"]})
    lines = [f"{product}: {', '.join(map(str, values))}"]
    running = values[0]
    for v in values[1:]:
        lines.append(_add(running, v))
        running += v
    subtotals = [f"{path.rsplit('/', 1)[-1].removesuffix('.csv')} {sum(vs)}" for path, vs in per_file if vs]
    return Work({**plan, 1: lines}, {1: [f"{', '.join(subtotals)} → {sum(values)}"]})


def _due_date_work(task: Task) -> Work:
    world = World.from_json(task.spec["world"])
    course = world.canvas.courses[task.spec["course"]]
    title = re.search(r'When is "(.+)" for ', task.instruction).group(1)
    assignment = next(a for a in course.assignments.values() if a.title == title)
    _check(task, assignment.due)
    return Work({1: [f"{course.name} is course {course.id}"],
                 2: [f'"{title}" is {assignment.id}, due {assignment.due}']},
                {2: [f'"{title}" → {assignment.due}']})


def _compare_work(task: Task) -> Work:
    a, b = task.spec["numbers"]
    word = "larger" if task.spec["larger"] else "smaller"
    answer = max(a, b) if task.spec["larger"] else min(a, b)
    _check(task, answer)
    # The first digit place where the two differ decides; max names it, high states the order.
    place = next(k for k in range(3) if str(a)[k] != str(b)[k])
    name = ("hundreds", "tens", "units")[place]
    lo, hi = sorted((a, b))
    lines = [f"{name}: {str(a)[place]} vs {str(b)[place]}, so {lo} < {hi}", f"the {word} is {answer}"]
    return Work({0: lines}, {0: [f"{lo} < {hi} → {answer}"]})


def _echo_work(task: Task) -> Work:
    return Work({0: [f'the word is "{task.spec["answer"]}"']}, {})


FAMILY_WORK: dict[str, Callable[[Task], Work]] = {"arith_word": _arith_work, "file_lookup": _lookup_work,
                                    "file_aggregate": _aggregate_work, "canvas_due_date": _due_date_work,
                                    "compare_numbers": _compare_work, "echo_word": _echo_work}


def _short(value, limit: int = 48) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(action: Action) -> str:
    """One action in harness-independent words, with its arguments."""
    if isinstance(action, Read):
        return f"read {action.path}"
    if isinstance(action, Write):
        return f"write {action.path} ({action.content.count(chr(10)) + 1} lines)"
    if isinstance(action, Edit):
        if "\n" not in action.old.strip() and "\n" not in action.new.strip():
            return f"edit {action.path}: `{_short(action.old.strip(), 60)}` → `{_short(action.new.strip(), 60)}`"
        first = action.old.strip().splitlines()[0] if action.old.strip() else ""
        return f"edit {action.path}: rewrite the block at `{_short(first, 60)}`"
    if isinstance(action, Run):
        return f"run `{_short(action.command)}`"
    if isinstance(action, Search):
        return f"search {action.path} for /{_short(action.pattern)}/"
    if isinstance(action, AppCall):
        args = ", ".join(f"{k}={_short(v, 32)}" for k, v in action.args.items())
        return f"{action.app}.{action.tool}({args})"
    if isinstance(action, Finish):
        return f"finish with the answer {action.answer}" if action.answer else "finish"
    raise TypeError(f"no description for {type(action).__name__}")


def _tool_name(action: Action) -> str:
    return f"{action.app}.{action.tool}" if isinstance(action, AppCall) else kind_of(action)


def _plan(actions: list[Action]) -> str:
    names: list[str] = []
    for a in actions:
        name = _tool_name(a)
        if names and names[-1].split(" ×")[0] == name:
            count = int(names[-1].split(" ×")[1]) + 1 if " ×" in names[-1] else 2
            names[-1] = f"{name} ×{count}"
        else:
            names.append(name)
    return "plan: " + ", ".join(names)


def scratchpads(task: Task, actions: list[Action]) -> dict[str, list[str | None]]:
    """Per effort, per turn: the scratchpad text, or None for a turn that answers directly."""
    work = FAMILY_WORK[task.family](task) if task.family in FAMILY_WORK else Work({}, {})
    n = len(actions)
    out: dict[str, list[str | None]] = {"low": [None] * n, "high": [None] * n, "max": [None] * n}
    for i, action in enumerate(actions):
        plan = [_plan(actions)] if i == 0 else []
        # The work first, then the step it decides: the answer is computed before it is written.
        out["max"][i] = "\n".join(plan + work.max_lines.get(i, []) + [f"step {i + 1}/{n}: {describe(action)}"])
        # high states the code changes too: which line a fix replaces is the work of a coding turn.
        changes = [describe(action)] if isinstance(action, (Edit, Write)) else []
        high_lines = plan + work.high_lines.get(i, []) + changes
        out["high"][i] = "\n".join(high_lines) if high_lines else None
    return out


# ----------------------------------------------------------------------------------------------
# Rendering to token ids. `turn_tokens` is the one definition of the conversation's special ids: the
# SFT rows below and every rollout of the policy (k3model.train.rollout.sft_format: evaluation, RL)
# are built from it, so the prompts the policy is evaluated and trained on are the ones it saw in SFT.

@dataclass(frozen=True)
class TurnTokens:
    """The special ids around each segment of an episode at one effort (see the module docstring)."""
    first_start: tuple[int, ...]  # <|bos|><|system|><|effort_E|>
    first_end: tuple[int, ...]  # <|end|><|effort_E|><|assistant|>
    observation_start: tuple[int, ...]  # <|tool_result|>
    observation_end: tuple[int, ...]  # <|tool_result_end|><|effort_E|><|assistant|>
    stop_id: int  # <|end|>: ends every assistant turn
    think_id: int
    think_end_id: int
    n_special: int  # ids below this are special tokens


def turn_tokens(tokenizer, effort: str) -> TurnTokens:
    if effort not in EFFORTS:
        raise ValueError(f"unknown effort {effort!r}: choose from {EFFORTS}")
    special = special_token_ids(tokenizer)
    tag = special[EFFORT_TOKENS[effort]]
    return TurnTokens(first_start=(special[BOS], special[SYSTEM], tag),
                      first_end=(special[END_OF_TURN], tag, special[ASSISTANT]),
                      observation_start=(special[TOOL_RESULT],),
                      observation_end=(special[TOOL_RESULT_END], tag, special[ASSISTANT]),
                      stop_id=special[END_OF_TURN], think_id=special[THINK], think_end_id=special[THINK_END],
                      n_special=len(special))


def action_ids(turn: TurnTokens, ids: list[int]) -> list[int]:
    """The part of an assistant turn's ids the environment is given: after the scratchpad (the last
    `<|think_end|>`; an unclosed `<|think|>` ends it), without `<|end|>`. Other special ids stay:
    kimi_code's call syntax writes `<|tool_call_end|>`, which the tokenizer encodes as that special
    token, so dropping specials would break its calls."""
    if turn.think_end_id in ids:
        ids = ids[len(ids) - ids[::-1].index(turn.think_end_id):]
    if turn.think_id in ids:
        ids = ids[: ids.index(turn.think_id)]
    return [i for i in ids if i != turn.stop_id]


def render(tokenizer, record: dict, effort: str, thoughts: list[str | None]) -> tuple[list[int], list[int], int]:
    """(input_ids, loss_mask, scratchpad tokens) of one episode record at one effort; see the module
    docstring. `thoughts[i]` is turn i's scratchpad (None: the turn answers directly)."""
    turn = turn_tokens(tokenizer, effort)
    ids: list[int] = []
    mask: list[int] = []
    n_think = 0

    def put(segment: list[int], own: bool) -> None:
        ids.extend(segment)
        mask.extend([int(own)] * len(segment))

    # <|effort_E|><|assistant|> closes each prompt segment: the caller writes it, as a rollout does.
    put([*turn.first_start, *encode(tokenizer, record["initial_observation"]), *turn.first_end], False)
    steps = record["steps"]
    for i, step in enumerate(steps):
        if thoughts[i] is not None:
            think = [turn.think_id] + encode(tokenizer, thoughts[i]) + [turn.think_end_id]
            put(think, True)
            n_think += len(think)
        put(encode(tokenizer, step["action"]) + [turn.stop_id], True)
        if i + 1 < len(steps):
            put([*turn.observation_start, *encode(tokenizer, step["observation"]), *turn.observation_end], False)
    return ids, mask, n_think


SCHEMA = pa.schema([
    ("family", pa.string()), ("domain", pa.string()), ("difficulty", pa.string()), ("harness", pa.string()),
    ("effort", pa.string()), ("task_seed", pa.int64()), ("task_id", pa.string()),
    ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
    ("n_tokens", pa.int32()), ("n_own_tokens", pa.int32()), ("n_think_tokens", pa.int32()), ("n_turns", pa.int32()),
])


def task_seed(cfg: SFTDataConfig, i: int) -> int:
    return SFT_TASK_SEED_BASE + cfg.seed * SEEDS_PER_CONFIG + i


def build_sft(cfg: SFTDataConfig, tokenizer) -> pa.Table:
    """The demonstrations table (schema `SCHEMA`, metadata: config, held-out harness, dropped rows)."""
    harnesses = cfg.resolved_harnesses()
    columns: dict[str, list] = {name: [] for name in SCHEMA.names}
    dropped: dict[str, int] = {}
    for family in cfg.resolved_families():
        offset = int(rng(cfg.seed, "sft", family).integers(len(harnesses)))
        for i in range(cfg.tasks_of(family)):
            seed = task_seed(cfg, i)
            harness = harnesses[(offset + i) % len(harnesses)]
            task = envs.generate(family, seed)
            record = demonstration(family, harness, seed)
            if record["reward"] != 1.0:
                raise ValueError(f"the expert failed {task.id} in {harness} (reward {record['reward']}): "
                                 "a demonstration must succeed; fix the family's solution")
            actions = list(get_family(family).solution(task))
            if len(actions) < len(record["steps"]):  # the expert finishes when its plan runs out
                actions.append(Finish())
            assert len(actions) == len(record["steps"]), (task.id, len(actions), len(record["steps"]))
            pads = scratchpads(task, actions)
            for effort in cfg.efforts:
                ids, mask, n_think = render(tokenizer, record, effort, pads[effort])
                if len(ids) > cfg.max_tokens:
                    dropped[family] = dropped.get(family, 0) + 1
                    continue
                row = {"family": family, "domain": task.domain, "difficulty": task.difficulty, "harness": harness,
                       "effort": effort, "task_seed": seed, "task_id": task.id, "input_ids": ids, "loss_mask": mask,
                       "n_tokens": len(ids), "n_own_tokens": sum(mask),
                       "n_think_tokens": n_think, "n_turns": len(actions)}
                for name, value in row.items():
                    columns[name].append(value)
    table = pa.Table.from_pydict(columns, schema=SCHEMA)
    meta = {"format": FORMAT, "config": asdict(cfg), "held_out_harness": HELD_OUT_HARNESS,
            "harnesses": list(harnesses), "families": list(cfg.resolved_families()),
            "dropped_too_long": dict(sorted(dropped.items()))}
    return with_metadata(table, meta)

