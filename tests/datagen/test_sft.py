"""SFT demonstrations: deterministic bytes, loss only on the model's own tokens, effort-shaped
scratchpads whose arithmetic is checked, and the held-out harness kept out."""

from __future__ import annotations

import dataclasses

import pytest

import envs
from datagen.io import table_metadata, write_parquet
from datagen.sft import (EFFORTS, HELD_OUT_HARNESS, SFTDataConfig, build_sft, scratchpads, task_seed)
from datagen.tokenizer import (ASSISTANT, EFFORT_TOKENS, END_OF_TURN, THINK, TOOL_RESULT, decode,
                               special_token_ids)
from envs.experts import demonstration
from envs.tasks import get_family

# One family per domain with work, plus a multi-turn app task: small and fast, every code path.
FAMILIES = ("arith_word", "file_aggregate", "canvas_due_date", "gmail_label", "fix_bug")


@pytest.fixture(scope="module")
def table(tok):
    return build_sft(SFTDataConfig(tasks_per_family=2, families=FAMILIES, max_tokens=100_000), tok)


def _rows(table):
    d = table.to_pydict()
    return [{k: d[k][i] for k in d} for i in range(table.num_rows)]


def test_same_config_same_bytes_and_another_seed_other_tasks(tok, table, tmp_path):
    again = build_sft(SFTDataConfig(tasks_per_family=2, families=FAMILIES, max_tokens=100_000), tok)
    assert write_parquet(table, tmp_path / "a.parquet") == write_parquet(again, tmp_path / "b.parquet")
    other = build_sft(SFTDataConfig(seed=1, tasks_per_family=1, families=("arith_word",)), tok)
    assert set(other.column("task_seed").to_pylist()).isdisjoint(table.column("task_seed").to_pylist())


def test_every_family_appears_at_every_effort_in_training_harnesses_only(table):
    rows = _rows(table)
    assert {(r["family"], r["effort"]) for r in rows} == {(f, e) for f in FAMILIES for e in EFFORTS}
    assert {r["domain"] for r in rows} == set(envs.tasks.DOMAINS)
    assert HELD_OUT_HARNESS not in {r["harness"] for r in rows}
    assert len({r["harness"] for r in rows}) >= 3
    assert table_metadata(table)["held_out_harness"] == HELD_OUT_HARNESS
    assert all(r["task_seed"] >= task_seed(SFTDataConfig(), 0) for r in rows)


def test_loss_falls_only_on_the_assistant_turns(tok, table):
    special = special_token_ids(tok)
    for r in _rows(table):
        ids, mask = r["input_ids"], r["loss_mask"]
        assert len(ids) == len(mask) == r["n_tokens"] and sum(mask) == r["n_own_tokens"]
        assert ids[2] == special[EFFORT_TOKENS[r["effort"]]] and not any(mask[:3])
        spans, start = [], None
        for t, own in enumerate(mask + [0]):
            if own and start is None:
                start = t
            elif not own and start is not None:
                spans.append((start, t))
                start = None
        # One span per turn, each right after <|assistant|> and ending with <|end|>.
        assert len(spans) == r["n_turns"]
        for a, b in spans:
            assert ids[a - 1] == special[ASSISTANT] and ids[b - 1] == special[END_OF_TURN]
            assert special[TOOL_RESULT] not in ids[a:b]
        # The own tokens are exactly the expert's actions (plus scratchpads): nothing of the prompt.
        record = demonstration(r["family"], r["harness"], r["task_seed"])
        own_text = "".join(decode(tok, ids[a:b]) for a, b in spans)
        for step in record["steps"]:
            assert step["action"] + "<|end|>" in own_text
        assert record["initial_observation"] not in own_text
        # The ids are the segments' encodings: decoding the row gives back every text in order (the
        # last observation, after the finish call, is not part of the row).
        text = decode(tok, ids)
        parts = [record["initial_observation"]]
        parts += [x for s in record["steps"] for x in (s["action"], s["observation"])]
        at = 0
        for part in parts[:-1]:
            at = text.index(part, at) + len(part)
        assert text.endswith(record["steps"][-1]["action"] + "<|end|>")


def test_low_answers_directly_and_max_thinks_more_than_high(tok, table):
    special = special_token_ids(tok)
    by_task = {}
    for r in _rows(table):
        by_task.setdefault(r["task_id"], {})[r["effort"]] = r
    for task_id, rows in by_task.items():
        assert special[THINK] not in rows["low"]["input_ids"] and rows["low"]["n_think_tokens"] == 0
        assert 0 < rows["high"]["n_think_tokens"] < rows["max"]["n_think_tokens"], task_id
        assert rows["low"]["n_own_tokens"] < rows["high"]["n_own_tokens"] < rows["max"]["n_own_tokens"]


def test_max_writes_every_addition_of_an_aggregation_and_high_the_subtotals():
    def hits(task):
        return sum(1 for text in task.spec["files"].values() for line in text.splitlines()
                   if line.startswith(task.spec["product"] + ","))

    task = next(t for t in (envs.generate("file_aggregate", s) for s in range(50)) if hits(t) >= 4)
    pads = scratchpads(task, get_family("file_aggregate").solution(task))
    answer = int(task.spec["answer"])
    sums = [line for line in pads["max"][1].splitlines() if " + " in line and " = " in line]
    assert len(sums) == hits(task) - 1 and sums[-1].endswith(f"= {answer}")
    for line in sums:  # each addition is right
        lhs, rhs = line.split(" = ")
        a, b = map(int, lhs.split(" + "))
        assert a + b == int(rhs)
    assert pads["high"][1].endswith(f"→ {answer}") and pads["high"][1].count(",") < len(sums)
    assert pads["low"] == [None, None]
    empty = next(t for t in (envs.generate("file_aggregate", s) for s in range(200)) if hits(t) == 0)
    assert "0 units" in scratchpads(empty, get_family("file_aggregate").solution(empty))["max"][1]


def test_arithmetic_that_disagrees_with_the_task_fails_generation():
    task = envs.generate("arith_word", 3)
    wrong = dataclasses.replace(task, spec={**task.spec, "answer": str(int(task.spec["answer"]) + 1)})
    with pytest.raises(ValueError, match="out of date"):
        scratchpads(wrong, get_family("arith_word").solution(wrong))
    odd = dataclasses.replace(task, instruction="What is the colour of the sky?")
    with pytest.raises(ValueError, match="ARITH_TEMPLATES"):
        scratchpads(odd, get_family("arith_word").solution(odd))


def test_rows_over_the_token_limit_are_dropped_and_counted(tok):
    table = build_sft(SFTDataConfig(tasks_per_family=1, families=("arith_word", "fix_bug"), max_tokens=1200), tok)
    assert set(table.column("family").to_pylist()) == {"arith_word"}
    assert table_metadata(table)["dropped_too_long"] == {"fix_bug": 3}


def test_a_family_weight_multiplies_its_tasks_and_keeps_its_first_ones(tok):
    plain = build_sft(SFTDataConfig(tasks_per_family=2, families=("echo_word", "slack_ping")), tok)
    heavy = build_sft(SFTDataConfig(tasks_per_family=2, families=("echo_word", "slack_ping"),
                                    family_weights=(("slack_ping", 3),)), tok)

    def seeds(table, family):
        return [s for f, s, e in zip(*(table.column(c).to_pylist() for c in ("family", "task_seed", "effort")))
                if f == family and e == "low"]
    assert len(seeds(heavy, "slack_ping")) == 6 and seeds(heavy, "echo_word") == seeds(plain, "echo_word")
    assert seeds(heavy, "slack_ping")[:2] == seeds(plain, "slack_ping")
    assert len(set(seeds(heavy, "slack_ping"))) == 6


@pytest.mark.parametrize("kwargs, match", [
    ({"family_weights": (("slack_ping", 2),), "families": ("echo_word",)}, "not among the families"),
    ({"family_weights": (("echo_word", 0),), "families": ("echo_word",)}, "weight"),
    ({"family_weights": (("echo_word", 2), ("echo_word", 3)), "families": ("echo_word",)}, "twice"),
    ({"harnesses": (HELD_OUT_HARNESS,)}, "held out"),
    ({"harnesses": ("emacs",)}, "unknown harness"),
    ({"efforts": ("medium",)}, "unknown effort"),
    ({"families": ("juggling",)}, "unknown task family"),
    ({"tasks_per_family": 0}, "tasks_per_family"),
])
def test_bad_config_says_what_to_change(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SFTDataConfig(**kwargs)
