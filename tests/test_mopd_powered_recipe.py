"""The MOPD equal-compute control's report (benchmarks/recipes/mopd_powered.py `report_control`) on
hand-made per-task counts: per cell and pooled, student − generalist with its power at ±CONTROL_EFFECT
beside the reading, "underpowered" where the interval holds 0 and the power is < 0.8."""

import json
from types import SimpleNamespace

import pytest

import benchmarks.recipes.mopd_powered as mopd_powered
from k3model.train import stats
from k3model.train.control import CONTROL_EFFECT


def scored(per_task: list[int]) -> dict:
    meta = {"mean_policy_tokens": 50.0}
    return {"sampled": {"per_task": per_task, "metadata": meta, "wall_s": 1.0},
            "greedy": {"per_task": [int(x > 4) for x in per_task], "metadata": meta, "wall_s": 1.0}}


def run(tmp_path, monkeypatch, student: dict, generalist: dict) -> dict:
    written = {}

    def dated_result(area, name, obj):
        written["out"] = json.loads(json.dumps(obj, default=float))
        return tmp_path / f"{name}.json"

    monkeypatch.setattr(mopd_powered, "dated_result", dated_result)
    cells = {c: {"eval_sft": scored([2, 3] * (len(v) // 2))} for c, v in generalist.items()}
    mopd_powered.report_control(SimpleNamespace(label="t"), {"flops": {"total": 1.0}, "turns": []},
                                {"cells": {c: scored(v) for c, v in student.items()}},
                                {"cells": {c: scored(v) for c, v in generalist.items()}}, cells, 8)
    return written["out"]


def test_a_null_reading_on_few_tasks_is_underpowered_and_a_clear_gain_is_read(tmp_path, monkeypatch, capsys):
    n = 32
    same = {"general_tasks/high": [3, 4] * (n // 2), "general_tasks/max": [2, 5] * (n // 2)}
    out = run(tmp_path, monkeypatch, same, same)
    pooled = out["pooled"]
    assert (pooled["lo"], pooled["hi"]) == (0.0, 0.0) and pooled["effect"] == CONTROL_EFFECT
    # The pooled power is the smaller direction of paired_mean_power on the generalist's counts (identical
    # arms: no measured spread, so the SE's figure is 1 and does not bind).
    counts = same["general_tasks/high"] + same["general_tasks/max"]
    gain, loss = stats.paired_mean_power(counts, 8, 0.05), stats.paired_mean_power([8 - x for x in counts], 8, 0.05)
    assert (pooled["power_gain"], pooled["power_loss"], pooled["se"], pooled["power_se"]) == (gain, loss, 0.0, 1.0)
    assert pooled["power"] == min(gain, loss)
    assert pooled["power"] < 0.8 and pooled["reads"] == "underpowered"
    for cell in same:
        row = out["per_cell"][cell]["student_minus_generalist"]
        assert row["reads"] == "underpowered" and row["power"] <= pooled["power"] and row["effect"] == CONTROL_EFFECT
    assert f"→ underpowered (power {pooled['power']:.2f} at ±5 points)" in capsys.readouterr().out
    # A +50-point student: read as a finding, whatever the power at ±5.
    better = {c: [min(8, x + 4) for x in v] for c, v in same.items()}
    assert run(tmp_path, monkeypatch, better, same)["pooled"]["reads"] == "MOPD consolidates better"
    assert run(tmp_path, monkeypatch, same, better)["pooled"]["reads"] == "the generalist consolidates better"


def test_a_spread_the_simulation_misses_lowers_the_power(monkeypatch, tmp_path):
    # 256 tasks a cell: the student +3 of 8 on every other task, −3 on the rest (mean 0). Only the
    # measured SE (sd 3/8) sees that spread: per cell Φ(0.05/(0.375/√256) − 1.96) = Φ(0.17) ≈ 0.57,
    # pooled over 512 tasks Φ(0.05/(0.375/√512) − 1.96) = Φ(1.06) ≈ 0.85.
    n = 256
    generalist = {"general_tasks/high": [3, 4] * (n // 2), "general_tasks/max": [2, 5] * (n // 2)}
    student = {c: [x + 3 if i % 2 == 0 else x - 3 for i, x in enumerate(v)] for c, v in generalist.items()}
    out = run(tmp_path, monkeypatch, student, generalist)
    for row in [out["pooled"]] + [c["student_minus_generalist"] for c in out["per_cell"].values()]:
        assert row["power"] == row["power_se"] < min(row["power_gain"], row["power_loss"])
        assert row["lo"] < 0 < row["hi"]
    assert out["per_cell"]["general_tasks/high"]["student_minus_generalist"]["power"] == pytest.approx(0.57, abs=0.02)
    assert out["per_cell"]["general_tasks/high"]["student_minus_generalist"]["reads"] == "underpowered"
    assert out["pooled"]["power"] == pytest.approx(0.85, abs=0.02)
    assert out["pooled"]["reads"] == "no difference shown"


@pytest.mark.parametrize("lo, hi, power, reads", [(0.01, 0.1, 0.2, "MOPD consolidates better"),
                                                  (-0.1, -0.01, 0.2, "the generalist consolidates better"),
                                                  (-0.02, 0.02, 0.79, "underpowered"),
                                                  (-0.02, 0.02, 0.8, "no difference shown")])
def test_control_reads(lo, hi, power, reads):
    assert mopd_powered.control_reads(lo, hi, power) == reads
