"""Claim 7's powered fold (benchmarks/recipes/transfer_powered.py) on hand-made phase files: the fold's
ratio and verdict after its power, and the single-harness control beside it (descriptive)."""

import json
import sys

import pytest

from benchmarks.recipes import transfer_powered


def write_dir(path, trained: list[str], scored_in: list[str], sft: list[int], arm: list[int]) -> None:
    path.mkdir()
    plan = {"args": {"k": 8, "eval_seed": 0}, "heldout_tasks": [["compare_numbers", i] for i in range(len(sft))],
            "train_harnesses": trained, "eval_harnesses": scored_in, "policy": "p", "cell": "general_tasks/high"}
    (path / "plan.json").write_text(json.dumps(plan))
    for phase, counts in (("eval_sft", sft), ("eval_specialist", arm)):
        (path / f"{phase}.json").write_text(json.dumps({"sampled": {"per_task": counts},
                                                         "greedy": {"per_task": [int(c > 4) for c in counts]}}))


def run(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["transfer_powered.py", *args])
    transfer_powered.main()


def test_the_fold_is_judged_after_its_power_and_the_control_is_shown_beside_it(tmp_path, monkeypatch, capsys):
    results = {}

    def dated_result(area: str, label: str, out: dict):
        results[label] = out
        return tmp_path / f"{label}.json"
    monkeypatch.setattr(transfer_powered, "dated_result", dated_result)
    n, three = 256, ["kimi_code", "claude_code", "codex"]
    sft = [2, 3] * (n // 2)
    # The fold arm gains +2 of 8 per task in its three harnesses and in hermes: all of it transfers.
    write_dir(tmp_path / "multi_in", three, three, sft, [4, 5] * (n // 2))
    write_dir(tmp_path / "multi_held", three, ["hermes"], sft, [4, 5] * (n // 2))
    # The control gains as much in kimi_code and half of it in hermes.
    write_dir(tmp_path / "single_in", ["kimi_code"], ["kimi_code"], sft, [4, 5] * (n // 2))
    write_dir(tmp_path / "single_held", ["kimi_code"], ["hermes"], sft, [3, 4] * (n // 2))
    fold = ["--in-work", str(tmp_path / "multi_in"), "--held-work", str(tmp_path / "multi_held")]
    with pytest.raises(SystemExit, match="transfer_power.json does not exist"):
        run(monkeypatch, *fold, "--label", "f", "--phases", "report")  # no verdict before its power
    run(monkeypatch, *fold, "--phases", "power")
    run(monkeypatch, *fold, "--label", "f", "--phases", "report")
    t = results["transfer_powered_f"]["transfer"]
    assert t["ratio"] == pytest.approx(1.0) and t["verdict"] == "pass" and t["power"] >= 0.8
    control = ["--control-in-work", str(tmp_path / "single_in"), "--control-held-work", str(tmp_path / "single_held")]
    run(monkeypatch, *fold, *control, "--label", "c", "--phases", "control")
    out = results["transfer_control_c"]
    assert out["ratios"]["control"]["ratio"] == pytest.approx(0.5) and out["ratios"]["control"]["trained"] == ["kimi_code"]
    assert out["difference"]["fold_minus_control"] == pytest.approx(0.5) and out["verdict"] is None
    # A control scored in another held-out harness is not this fold's control.
    write_dir(tmp_path / "codex_held", ["kimi_code"], ["openclaw"], sft, sft)
    with pytest.raises(SystemExit, match="other tasks, seeds or held-out harness"):
        run(monkeypatch, *fold, "--control-in-work", str(tmp_path / "single_in"), "--control-held-work",
            str(tmp_path / "codex_held"), "--label", "c", "--phases", "control")
