"""The task ladder: pass@k, family selection at the edge of competence, seeds, the random and expert
floors, the report's round trip."""

import json

import pytest

from datagen.sft import SFT_FAMILIES
from k3model.train.effort import training_harnesses
from k3model.train.evaluate import resolve_harnesses
from k3model.train.ladder import (EVAL_SEED_BASE, HARD_FAMILIES, RL_SEED_BASE, LadderCell, LadderConfig, LadderReport,
                                   baseline_success, domain_families, hard_instances, hard_tasks, heldout_tasks, mean_pass_at_k,
                                   select_families, tasks_of)
from k3model.train.recipes import STARTER_FAMILIES
from k3model.train.stats import pass_at_k


def test_pass_at_k_is_the_unbiased_estimator():
    # G = k = 8: 1 if the task was solved at all, else 0.
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0
    # k = 1 is the plain success rate; n = 4, c = 1, k = 2: 1 − C(3, 2)/C(4, 2) = 1 − 3/6.
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n = 10, c = 2, k = 8: 1 − C(8, 8)/C(10, 8) = 1 − 1/45.
    assert pass_at_k(10, 2, 8) == pytest.approx(44 / 45)
    # Three tasks of G = 8 with 0, 1 and 5 successes: two of three solved at least once.
    assert mean_pass_at_k([0, 1, 5], 8, 8) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="draw more samples or lower k"):
        pass_at_k(2, 1, 8)
    with pytest.raises(ValueError, match="successes"):
        pass_at_k(8, 9, 8)
    with pytest.raises(ValueError, match="raise samples or lower k"):
        LadderConfig(samples=2)


def test_families_with_pass1_in_the_band_and_pass8_high_are_selected_else_the_nearest():
    band, at_k_min = (0.2, 0.6), 0.8
    rates = {"a": (3, 8), "b": (4, 8), "c": (7, 8), "d": (1, 8)}
    # a: 0.375 and 0.9 → in; b: 0.5 but pass@8 0.5 (a new skill on half the tasks) → out; c: 0.875
    # above the band; d: 0.125 below it.
    assert select_families(rates, {"a": 0.9, "b": 0.5, "c": 1.0, "d": 0.8}, band, at_k_min) == (["a"], True)
    # The edges count as inside.
    assert select_families({"a": (2, 10), "b": (6, 10)}, {"a": 0.8, "b": 0.8}, band, at_k_min) == (["a", "b"], True)
    # None inside. Distances: a 0.2 + 0.8 = 1.0, b 0.15 + 0 = 0.15, c 0 + 0.3 = 0.3 → b.
    assert select_families({"a": (0, 8), "b": (6, 8), "c": (3, 8)}, {"a": 0.0, "b": 1.0, "c": 0.5},
                           band, at_k_min) == (["b"], False)
    # A family with successes beats one without, however near: a (pass@1 0, distance 0.2) vs
    # b (0.95, pass@8 0.1: distance 0.35 + 0.7 = 1.05).
    assert select_families({"a": (0, 8), "b": (19, 20)}, {"a": 1.0, "b": 0.1}, band, at_k_min) == (["b"], False)
    assert select_families({"a": (0, 8)}, {"a": 0.0}, band, at_k_min) == (["a"], False)
    with pytest.raises(ValueError, match="no pass@k"):
        select_families({"a": (1, 8)}, {}, band, at_k_min)


def test_the_report_gives_rl_and_held_out_tasks_of_the_selected_families_and_round_trips():
    cells = [LadderCell("general_tasks", "low", {"echo_word": (5, 8), "arith_word": (0, 8)}, ["echo_word"], True,
                        0.5, 40.0, {"echo_word": 1.0, "arith_word": 0.0}, {"echo_word": (0, 1), "arith_word": (0, 1)},
                        {"rl": {"random": (0, 3), "expert": (3, 3)}, "heldout": {"random": (1, 3), "expert": (2, 3)}})]
    report = LadderReport(LadderConfig(), cells, 1.0)
    rl, held = report.rl_tasks("general_tasks", "low", 3), report.eval_tasks("general_tasks", "low", 3)
    assert [t.id for t in rl] == ["echo_word/0", "echo_word/1", "echo_word/2"]
    assert all(t.family == "echo_word" and t.seed >= EVAL_SEED_BASE for t in held)
    assert report.cell("general_tasks", "low").pass_rate == 5 / 8
    again = LadderReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again.to_json() == report.to_json() and "| general_tasks | low |" in again.table()
    md = report.as_metadata()
    assert md["general_tasks/low/selected"] == "echo_word" and md["general_tasks/low/pass_at_k"] == 1.0
    assert md["general_tasks/low/family/arith_word/greedy"] == 0.0 and md["general_tasks/low/heldout/expert"] == 2 / 3
    assert report.random_passes() == ["general_tasks/low/heldout"]
    assert "| general_tasks | low | heldout | 3 | 0.33 | 0.67 |" in again.baseline_table()
    with pytest.raises(ValueError, match="no cell"):
        report.cell("coding_agents", "max")
    # Bad input names the valid values.
    with pytest.raises(ValueError, match="choose one of low, high, max"):
        report.rl_tasks("general_tasks", "medium")
    with pytest.raises(ValueError, match="choose one of general_tasks, general_agents, coding_agents"):
        report.cell("poetry", "low")


def test_a_ladder_written_before_pass_at_k_still_reads():
    old = {"config": {"tasks_per_family": 1, "samples": 2, "temperature": 1.0, "band": [0.1, 0.9], "seed": 0,
                      "domains": ["general_tasks"], "efforts": ["low"], "families": ["echo_word"]},
           "cells": [{"domain": "general_tasks", "effort": "low", "families": {"echo_word": [1, 2]},
                      "selected": ["echo_word"], "in_band": True, "informative_frac": 1.0, "tokens": 4.0}]}
    report = LadderReport.from_json(old)
    assert report.config.k == 2 and report.cell("general_tasks", "low").pass_at_k == {}
    assert [t.id for t in report.rl_tasks("general_tasks", "low", 1)] == ["echo_word/0"]


def test_held_out_tasks_never_repeat_an_rl_prompt():
    # echo_word has 20 words × 3 phrasings: 64 RL prompts cover many of them, and seeds alone would
    # put some of those prompts in the held-out set.
    rl = tasks_of(["echo_word", "compare_numbers"], 64, 0)
    plain = {t.instruction for t in tasks_of(["echo_word"], 32, EVAL_SEED_BASE)}
    assert plain & {t.instruction for t in rl}, "the check below would be vacuous"
    held = heldout_tasks(["echo_word", "compare_numbers"], 32, exclude=rl)
    assert [t.family for t in held] == ["echo_word"] * 32 + ["compare_numbers"] * 32
    assert len({t.id for t in held}) == 64 and all(t.seed >= EVAL_SEED_BASE for t in held)
    assert not {(t.family, t.instruction) for t in held} & {(t.family, t.instruction) for t in rl}
    # Every one of the first 100 held-out seeds excluded: it gives up instead of searching forever.
    with pytest.raises(ValueError, match="fewer than"):
        heldout_tasks(["echo_word"], 1, exclude=tasks_of(["echo_word"], 100, EVAL_SEED_BASE))


def test_domains_and_hard_splits():
    assert set(domain_families("coding_agents")) == {"write_constant", "write_number", "write_function"}
    assert {t.family for t in hard_tasks("general_tasks", 2)} == {"arith_word"}
    with pytest.raises(ValueError, match="unknown domain"):
        domain_families("poetry")
    with pytest.raises(ValueError, match="band"):
        LadderConfig(band=(0.9, 0.1))


def test_hard_instances_are_distinct_held_out_tasks_of_the_harder_family():
    tasks = hard_instances(["compare_numbers"], 64)
    assert len(tasks) == 64 and {t.family for t in tasks} == {"compare_numbers_close"}
    assert len({t.instruction for t in tasks}) == 64 and min(t.seed for t in tasks) >= EVAL_SEED_BASE
    with pytest.raises(ValueError, match="no hard instances of \\['slack_ping'\\].*compare_numbers"):
        hard_instances(["slack_ping"], 4)


def test_measure_ladder_plays_every_family_at_every_effort(smoke_tok):
    from dataclasses import replace

    import torch

    from k3model.config import get_profile
    from k3model.model import K3Model
    from k3model.train.effort import EffortSpec
    from k3model.train.ladder import measure_ladder

    torch.manual_seed(0)
    model = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded")).eval()
    specs = {e: EffortSpec(budget_tokens=4, length_coef=0.0, turn_tokens=4) for e in ("low", "high", "max")}
    cfg = LadderConfig(tasks_per_family=1, samples=2, k=2, efforts=("low", "max"), domains=("general_tasks",),
                       families=("echo_word", "compare_numbers"), rl_tasks_per_family=3,
                       heldout_tasks_per_family=2, hard_tasks=2, baseline_tasks_per_family=2)
    report = measure_ladder(model, smoke_tok, cfg, specs=specs)
    assert [(c.domain, c.effort) for c in report.cells] == [("general_tasks", "low"), ("general_tasks", "max")]
    for c in report.cells:
        # A random model solves nothing: no family is in the band, and the ladder says so.
        assert c.families == {"echo_word": (0, 2), "compare_numbers": (0, 2)} and not c.in_band
        assert c.pass_at_k == {"echo_word": 0.0, "compare_numbers": 0.0}
        assert c.greedy == {"echo_word": (0, 1), "compare_numbers": (0, 1)}
        assert c.selected == ["echo_word"] and c.tokens <= 4
        # The first 2 tasks of each split: the random policy fails them all, the expert solves them all.
        assert c.baselines == {s: {"random": (0, 2), "expert": (2, 2)} for s in ("rl", "heldout", "hard")}
    assert report.random_passes() == []
    assert "| general_tasks | max | hard | 2 | 0.00 | 1.00 |" in report.baseline_table()


# Every family a ladder can select (tiny's starter families and every SFT family) and the hard splits.
LADDER_FAMILIES = sorted(set(SFT_FAMILIES) | set(STARTER_FAMILIES) | {f for fs in HARD_FAMILIES.values() for f in fs})


@pytest.mark.parametrize("family", LADDER_FAMILIES)
def test_no_random_policy_passes_a_ladder_family_and_the_expert_passes_all(family):
    # 4 tasks of the RL seeds and 4 of the held-out seeds, each in every training harness
    # (round-robin, as the evaluation assigns them). A random success here is a verifier to report,
    # not to loosen; the rl_tasks asset counts the random policy's successes on every split it plays.
    tasks = tasks_of([family], 4, RL_SEED_BASE) + tasks_of([family], 4, EVAL_SEED_BASE)
    harnesses = resolve_harnesses(len(tasks), None)
    assert len(set(harnesses)) == len(training_harnesses())
    assert baseline_success(tasks, harnesses, "random") == [0] * 8
    assert baseline_success(tasks, harnesses, "expert") == [1] * 8
    with pytest.raises(ValueError, match="choose from"):
        baseline_success(tasks, harnesses, "monkey")
