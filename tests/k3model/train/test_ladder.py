"""The task ladder: family selection at the edge of competence, seeds, the report's round trip."""

import json

import pytest

from k3model.train.ladder import (EVAL_SEED_BASE, LadderCell, LadderConfig, LadderReport, domain_families,
                                   hard_tasks, heldout_tasks, select_families, tasks_of)


def test_families_in_the_band_are_selected_else_the_nearest_with_some_signal():
    band = (0.1, 0.9)
    assert select_families({"a": (4, 8), "b": (0, 8), "c": (7, 8)}, band) == (["a", "c"], True)
    # None inside: 0.95 is nearer than 0.0 — and a family with successes beats one with none.
    assert select_families({"a": (0, 20), "b": (19, 20)}, band) == (["b"], False)
    assert select_families({"a": (0, 8), "b": (1, 40)}, band) == (["b"], False)
    assert select_families({"a": (0, 8)}, band) == (["a"], False)


def test_the_report_gives_rl_and_held_out_tasks_of_the_selected_families_and_round_trips():
    cells = [LadderCell("general_tasks", "low", {"echo_word": (5, 8), "arith_word": (0, 8)}, ["echo_word"], True,
                        0.5, 40.0)]
    report = LadderReport(LadderConfig(), cells, 1.0)
    rl, held = report.rl_tasks("general_tasks", "low", 3), report.eval_tasks("general_tasks", "low", 3)
    assert [t.id for t in rl] == ["echo_word/0", "echo_word/1", "echo_word/2"]
    assert all(t.family == "echo_word" and t.seed >= EVAL_SEED_BASE for t in held)
    assert report.cell("general_tasks", "low").pass_rate == 5 / 8
    again = LadderReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again.to_json() == report.to_json() and "| general_tasks | low |" in again.table()
    assert report.as_metadata()["general_tasks/low/selected"] == "echo_word"
    with pytest.raises(ValueError, match="no cell"):
        report.cell("coding_agents", "max")


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
    cfg = LadderConfig(tasks_per_family=1, samples=2, efforts=("low", "max"), domains=("general_tasks",),
                       families=("echo_word", "compare_numbers"))
    report = measure_ladder(model, smoke_tok, cfg, specs=specs)
    assert [(c.domain, c.effort) for c in report.cells] == [("general_tasks", "low"), ("general_tasks", "max")]
    for c in report.cells:
        # A random model solves nothing: no family is in the band, and the ladder says so.
        assert c.families == {"echo_word": (0, 2), "compare_numbers": (0, 2)} and not c.in_band
        assert c.selected == ["echo_word"] and c.tokens <= 4
