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
