"""The powered job's claim-3 summary (benchmarks/recipes/powered.py) on hand-made phase files: Holm
across cells, the rule, "underpowered" and "not run", tokens by effort."""

import json

from benchmarks.recipes.powered import claim3


def scored(per_task: list[int], tokens: float) -> dict:
    meta = {"mean_policy_tokens": tokens}
    return {"sampled": {"per_task": per_task, "metadata": meta, "wall_s": 1.0},
            "greedy": {"per_task": [int(x > 4) for x in per_task], "metadata": meta, "wall_s": 1.0}}


def write_cell(root, cell: str, sft: list[int], spec: list[int], power: float, tokens: float) -> None:
    d = root / cell.replace("/", "_")
    d.mkdir()
    (d / "plan.json").write_text(json.dumps({"args": {"k": 8}}))
    (d / "eval_sft.json").write_text(json.dumps({**scored(sft, tokens), "power": {"pass1_bootstrap": power}}))
    (d / "eval_specialist.json").write_text(json.dumps(scored(spec, tokens + 1)))


def test_cells_are_judged_with_holm_and_power_and_tokens_by_effort(tmp_path):
    n = 64
    sft = [2, 3] * (n // 2)
    write_cell(tmp_path, "general_tasks/low", sft, [5, 6] * (n // 2), 0.9, 50)  # +37 points: pass
    write_cell(tmp_path, "general_tasks/high", sft, [2, 4] * (n // 2), 0.9, 70)  # +6: below the rule's +10
    write_cell(tmp_path, "general_tasks/max", sft, [5, 6] * (n // 2), 0.5, 90)  # gains, but underpowered
    (tmp_path / "coding_agents_high").mkdir()  # refused before training: eval_sft only, power < 0.8
    (tmp_path / "coding_agents_high" / "eval_sft.json").write_text(json.dumps({"power": {"pass1_bootstrap": 0.4}}))
    (tmp_path / "general_agents_high").mkdir()  # no headroom: sft_policy already near the ceiling
    (tmp_path / "general_agents_high" / "eval_sft.json").write_text(json.dumps(
        {"power": {"pass1_bootstrap": 0.0, "why": "sft_policy pass@1 0.867 leaves 13.3 points"}}))
    out = claim3(["general_tasks/low", "general_tasks/high", "general_tasks/max", "coding_agents/low",
                  "coding_agents/high", "general_agents/high"], tmp_path)
    cells = out["cells"]
    assert [cells[c]["verdict"] for c in ("general_tasks/low", "general_tasks/high", "general_tasks/max")] == \
        ["pass", "fail", "underpowered"]
    assert cells["coding_agents/low"]["verdict"] == "not run" and "lacks plan" in cells["coding_agents/low"]["why"]
    assert cells["general_tasks/low"]["p_holm"] >= cells["general_tasks/low"]["p"]
    assert cells["coding_agents/high"]["verdict"] == "underpowered" and cells["coding_agents/high"]["power"] == 0.4
    assert cells["general_agents/high"]["verdict"] == "underpowered" and "13.3 points" in cells["general_agents/high"]["why"]
    assert (out["passed"], out["of"]) == (1, 6)
    assert out["tokens_by_effort"] == {"general_tasks": {"low_high_max": [51, 71, 91], "ordered": True}}


def test_the_hard_split_scores_max_against_low_after_its_power(tmp_path, monkeypatch):
    """hard_split's orchestration with the scoring replaced: the arms in order (the power written before
    the max arm is scored), max ≥ low by the margin, the "not hard" gate, a family without hard instances."""
    import benchmarks.recipes.powered as powered
    import k3model.train.paired_eval as paired_eval
    n, order = 64, []
    per_arm = {"sft_policy_low": [2, 3] * (n // 2), "low_specialist": [3, 3] * (n // 2), "max_specialist": [3, 4] * (n // 2)}

    def fake_score(checkpoint, name, tokenizer, tasks, effort, *, k, seed, specs):
        arm = name.rsplit(" ", 1)[1]
        order.append((arm, effort, (tmp_path / "hard_general_tasks" / "power.json").exists()))
        assert len(tasks) == n and {t.family for t in tasks} == {"compare_numbers_close"} and k == 8
        return scored(per_arm[arm], 50 if effort == "low" else 110)

    monkeypatch.setattr(paired_eval, "score_policy", fake_score)
    for domain, family in (("general_tasks", "compare_numbers"), ("general_agents", "slack_ping")):
        for effort in ("low", "max"):
            d = tmp_path / f"{domain}_{effort}"
            d.mkdir()
            (d / "plan.json").write_text(json.dumps({"args": {"k": 8, "eval_seed": 0}, "families": [family],
                                                     "policy": "sft", "tokenizer": "tok"}))
            (d / "eval_specialist.json").write_text(json.dumps({"checkpoint": f"{domain}_{effort}"}))
    out = powered.hard_split(["general_tasks/low", "general_tasks/max", "general_agents/low", "general_agents/max",
                              "coding_agents/low"], tmp_path, n)
    assert order == [("sft_policy_low", "low", False), ("low_specialist", "low", False), ("max_specialist", "max", True)]
    gt = out["general_tasks"]
    assert gt["sft_low_below_half"] and gt["max_minus_low"]["pass1"]["difference"] == 0.0625
    assert gt["verdict"] == ("pass" if gt["power"] >= 0.8 else "underpowered")
    assert out["general_agents"]["verdict"] == "no hard split" and "slack_ping" in out["general_agents"]["why"]
    assert "coding_agents" not in out  # its max cell was not run
    per_arm["sft_policy_low"] = [5, 5] * (n // 2)  # sft_policy at low above half: the split is not hard
    for f in (tmp_path / "hard_general_tasks").glob("*.json"):
        f.unlink()
    assert powered.hard_split(["general_tasks/low", "general_tasks/max"], tmp_path, n)["general_tasks"]["verdict"] \
        .startswith("not hard")
