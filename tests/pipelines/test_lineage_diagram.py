"""The README's lineage picture is drawn from the real asset graph (pipelines/lineage_diagram.py)."""

from pipelines.lineage_diagram import mermaid


def test_mermaid_draws_the_graph_in_order_without_implied_edges():
    text = mermaid("smoke")
    lines = text.splitlines()
    assert lines[0] == "flowchart LR" and "  subgraph smoke_pretraining" in lines
    for edge in ("corpus --> tokenizer", "pretrain_stage_1 --> pretrain_stage_2", "pretrain_stage_4 --> base_model",
                 "base_model --> sft_policy", "rl_tasks --> rl_specialist", "draft_model --> report"):
        assert f"  {edge}" in lines
    # Implied by a longer path: corpus → tokenizer → clue_data → pretrain_stage_1 → pretrain_stage_2.
    assert "  corpus --> pretrain_stage_2" not in lines and "  base_model --> report" not in lines
    assert "tiny" not in text
