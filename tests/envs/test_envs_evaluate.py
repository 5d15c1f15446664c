"""The policy table script: runs a small grid and writes JSON + markdown."""

import json

from envs.evaluate_policies import main


def test_evaluate_policies_writes_json_and_markdown(tmp_path, capsys):
    out = tmp_path / "table"
    assert main(["--families", "arith_word", "slack_post", "--harnesses", "hermes", "codex",
                 "--seeds", "2", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["by_family"]) == {"arith_word", "slack_post"}
    assert set(result["by_harness"]) == {"hermes", "codex"}
    assert result["by_family"]["slack_post"]["expert"] == 1.0
    assert result["by_family"]["arith_word"]["random"] == 0.0
    assert len(result["cells"]) == 2 * 2 * 3
    md = out.with_suffix(".md").read_text()
    assert "| slack_post | general_agents | easy |" in md and md in capsys.readouterr().out
