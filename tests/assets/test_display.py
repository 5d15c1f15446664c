"""Metadata display helpers (assets/display.py): floats kept to six significant digits, and a table
too wide for the UI's metadata column split by columns, each part under its row labels."""

import math

from assets.display import TABLE_WIDTH_CHARS, markdown_table, rounded


def test_rounded_keeps_six_significant_digits_and_leaves_the_rest():
    out = rounded({"rate": 0.6896551724137931, "lr": 7.735227284097083e-9, "ppl": 5.303589175297664,
                   "steps": 120, "name": "x", "bad": float("nan"), "big": float("inf")})
    assert out["rate"] == 0.689655 and out["lr"] == 7.73523e-9 and out["ppl"] == 5.30359
    assert out["steps"] == 120 and out["name"] == "x" and math.isnan(out["bad"]) and out["big"] == math.inf
    assert list(out) == ["rate", "lr", "ppl", "steps", "name", "bad", "big"]


def _tables(text):
    """[[header cells], [row cells], …] of each Markdown table in `text`."""
    return [[[c.strip() for c in line.strip("|").split("|")] for line in t.splitlines() if not line.startswith("|---")]
            for t in text.split("\n\n")]


def test_a_wide_numeric_table_is_split_under_its_row_labels():
    buckets = ["d0-32", "d32-256", "d256-1024", "d1024-4096", "d4096-8192"]
    rows = [{"stage": s, "seq_len": 64 * 4 ** s, "ppl": 61.52 - s, "vqa": 0.375, **{b: 0.9121 for b in buckets}}
            for s in range(1, 5)]
    tables = _tables(markdown_table(rows))
    assert len(tables) == 2
    # Every column once, the row label in each part, every row in each part.
    assert [c for t in tables for c in t[0][1:]] == ["seq_len", "ppl", "vqa", *buckets]
    assert all(t[0][0] == "stage" and [r[0] for r in t[1:]] == ["1", "2", "3", "4"] for t in tables)
    for t in tables:
        widest = [max(len(w) for cell in col for w in cell.replace("-", " ").split()) + 3 for col in zip(*t)]
        assert sum(widest) <= TABLE_WIDTH_CHARS, t[0]


def test_text_that_wraps_and_narrow_tables_stay_one_table():
    words = {"claim": 1, "status": "pass", "figure": "a long figure that the UI wraps at its spaces " * 3, "n": 5}
    assert len(_tables(markdown_table([words]))) == 1
    assert markdown_table([{"ppl": 440.45461830106336, "load": 1.1692708333333333}]).splitlines()[2] == "| 440.5 | 1.169 |"
    assert markdown_table([{"a": 1}]) == "| a |\n|---|\n| 1 |"


def test_the_row_label_is_the_fewest_leading_columns_that_tell_the_rows_apart():
    rows = [{"domain": d, "effort": e, "n": 64, "success": 0.2857, "ci95": "[0.12, 0.40]", "tokens/answer": 123.4,
             "base_model success": 0.25, "base_model tokens/answer": 140.2}
            for d in ("general_tasks", "coding_agents") for e in ("low", "max")]
    tables = _tables(markdown_table(rows))
    assert len(tables) > 1
    assert all(t[0][:2] == ["domain", "effort"] and [r[:2] for r in t[1:]] == [r[:2] for r in tables[0][1:]]
               for t in tables)
    assert [c for t in tables for c in t[0][2:]] == list(rows[0])[2:]
