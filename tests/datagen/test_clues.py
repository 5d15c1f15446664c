"""datagen.clues: exact answers needing every clue, distances in their buckets, control twins with the
same tokens, exact lengths, the checker itself, and determinism."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from datagen.clues import (
    KINDS,
    CluesConfig,
    _STATEMENT_RE,
    clue_eval_grid,
    clue_eval_set,
    clue_training_examples,
    clue_training_set,
    distance_buckets,
    eval_cells,
    home_cells,
    make_example,
    needs_every_clue,
    solve,
)
from datagen.io import write_parquet
from datagen.seeding import rng
from datagen.tokenizer import BOS, EOS, decode


@pytest.fixture(scope="module")
def grid(cfg, tok, corpus):
    return clue_eval_grid(cfg.clues, tokenizer=tok, corpus=corpus)


def _rows(table):
    return table.to_pylist()


def test_solver():
    q = "\nQuestion: What is C3?\nAnswer:"
    assert solve(" A1 = 5. filler B2 = A1. more C3 = B2." + q) == "5"
    assert solve(" B2 = A1. C3 = B2." + q) is None  # A1 never assigned
    assert solve(" A1 = 5. A1 = 6. B2 = A1. C3 = B2." + q) is None  # conflicting assignments
    assert solve(" B2 = C3. C3 = B2." + q) is None  # cycle
    assert solve(" A1 = 3. B22 = 4. Z9 = 1.\nQuestion: What is B22 + A1?\nAnswer:") == "7"
    # Statements after the question do not count; a name inside a longer one is not that name.
    assert solve(" XA1 = 5.\nQuestion: What is A1?\nAnswer: A1 = 5.") is None
    # recall: every value, in the question's order; one missing name leaves it undetermined.
    assert solve(" B = 5. text Q7 = 2. A = 9.\nQuestion: What are A, B?\nAnswer:") == "A = 9, B = 5"
    assert solve(" B = 5. Q7 = 2.\nQuestion: What are A, B?\nAnswer:") is None


def test_grid_cells_cover_reachable_buckets(cfg, grid):
    cells = set(zip(grid.column("length_target").to_pylist(), grid.column("bucket").to_pylist()))
    assert cells == set(eval_cells(cfg.clues))
    buckets = distance_buckets(cfg.clues)
    for length in cfg.clues.context_lengths:
        reached = sorted(b for l, b in cells if l == length)
        # The nearest buckets up to the last one a sequence of this length can reach.
        assert reached == list(range(len(reached))) and buckets[reached[-1]][0] < length
        assert reached[-1] == len(buckets) - 1 or buckets[reached[-1] + 1][0] >= length - 40
    assert grid.num_rows == 2 * cfg.clues.eval_per_cell * len(cells)


def test_every_eval_answer_is_exact_and_needs_every_clue(tok, grid):
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    for row in _rows(grid):
        prompt = np.array(row["prompt_ids"], np.int32)
        assert prompt[0] == bos
        assert len(prompt) + len(row["answer_ids"]) == row["length"] == row["length_target"]
        assert decode(tok, row["answer_ids"]) == f" {row['answer']}{EOS}"
        text = decode(tok, prompt)
        assert solve(text) == row["answer"]
        for s, e in zip(row["clue_starts"], row["clue_ends"]):
            assert solve(decode(tok, np.concatenate([prompt[:s], prompt[e:]]))) is None
        # Distractors share the clues' surface form: every statement in the text is a clue or one.
        assert len(_STATEMENT_RE.findall(text)) == row["n_clues"] + row["n_distractors"]
        assert eos not in prompt


def test_scattered_distances_fall_in_their_buckets(grid):
    for row in _rows(grid):
        distance = row["question_start"] - row["clue_ends"][0]
        assert distance == row["distance"]
        # Clue 1 is the farthest: the others sit between it and the question, in order.
        assert row["clue_starts"] == sorted(row["clue_starts"])
        assert row["clue_ends"][-1] <= row["question_start"]
        if row["variant"] == "scattered":
            assert row["bucket_lo"] <= distance < row["bucket_hi"]


def test_control_twin_has_same_tokens_and_adjacent_facts(grid):
    rows = _rows(grid)
    for scattered, control in zip(rows[0::2], rows[1::2]):
        assert (scattered["variant"], control["variant"]) == ("scattered", "control")
        assert scattered["pair_id"] == control["pair_id"]
        assert Counter(scattered["prompt_ids"]) == Counter(control["prompt_ids"])
        assert scattered["answer_ids"] == control["answer_ids"]
        # Needed facts sit back to back right before the question.
        starts, ends = control["clue_starts"], control["clue_ends"]
        assert ends[-1] == control["question_start"]
        assert all(e == s for e, s in zip(ends[:-1], starts[1:]))
        assert control["distance"] == ends[-1] - ends[0]
        assert control["distance"] <= scattered["distance"]


def test_grid_mixes_kinds_and_clue_counts(cfg, grid):
    assert set(grid.column("kind").to_pylist()) == set(KINDS)
    counts = set(grid.column("n_clues").to_pylist())
    assert counts == set(range(cfg.clues.min_clues, cfg.clues.max_clues + 1))
    assert min(grid.column("n_distractors").to_pylist()) >= 0
    assert max(grid.column("n_distractors").to_pylist()) >= cfg.clues.min_distractors


def test_training_examples(cfg, tok, train_filler):
    length = cfg.clues.context_lengths[-1]
    examples = clue_training_examples(cfg.clues, length, 24, tokenizer=tok, filler=train_filler)
    for ex in examples:
        assert ex.length == length and ex.variant == "scattered"
        assert ex.input_ids[ex.answer_end] == tok.token_to_id(EOS)
        assert needs_every_clue(tok, ex)
    # Distances are spread over the reachable range (log-uniform target), not fixed.
    distances = [ex.distance for ex in examples]
    assert min(distances) < length // 8 and max(distances) > length // 2


def test_training_table(cfg, tok, corpus):
    t = clue_training_set(cfg.clues, 128, 8, tokenizer=tok, corpus=corpus)
    for row in _rows(t):
        ids = row["input_ids"]
        assert len(ids) == 128
        assert decode(tok, ids[row["answer_start"] : row["answer_end"]]) == " " + row["answer"]


def test_long_layout_hits_narrow_buckets(cfg, tok, heldout_filler):
    # A 4-clue problem in a long sequence, pushed into the nearest bucket and into the farthest.
    clues = replace(cfg.clues, max_clues=4)
    for bucket in [(0, 32), (400, 420)]:
        for kind in KINDS:
            s, c = make_example(clues, tok, heldout_filler, 512, rng(1, kind, bucket[0]), bucket, kind, 4)
            assert bucket[0] <= s.distance < bucket[1]
            assert needs_every_clue(tok, s) and needs_every_clue(tok, c)


def test_impossible_request_raises(cfg, tok, heldout_filler):
    # The message names the length and the distance asked for; nothing is placed closer instead.
    with pytest.raises(ValueError, match=r"could not lay out .*length 64 .*distance 200 "):
        make_example(cfg.clues, tok, heldout_filler, 64, rng(0), (200, 300))
    with pytest.raises(ValueError, match="distance_bucket"):
        clue_eval_set(cfg.clues, 64, 99, tokenizer=tok, filler=heldout_filler)


def test_eval_set_deterministic_and_seeded(cfg, tok, corpus, tmp_path):
    a = clue_eval_set(cfg.clues, 128, 1, tokenizer=tok, corpus=corpus)
    b = clue_eval_set(cfg.clues, 128, 1, tokenizer=tok, corpus=corpus)
    c = clue_eval_set(replace(cfg.clues, seed=1), 128, 1, tokenizer=tok, corpus=corpus)
    ha, hb, hc = (write_parquet(t, tmp_path / f"{n}.parquet") for n, t in zip("abc", (a, b, c)))
    assert ha == hb != hc


def test_each_bucket_pairs_sit_in_its_home_cell(cfg, tok, corpus):
    """eval_pairs_per_bucket: a bucket's pairs in its shortest length's cell, eval_per_cell in the
    others, and pair i of a cell the same example whatever the cell's size."""
    small = replace(cfg.clues, eval_per_cell=1)
    sized = replace(small, eval_pairs_per_bucket=(3, 2, 2, 2, 2))
    # smoke: lengths 64 … 512, edges 0, 32, 64, 128, 256, 512 — bucket [128, 256) first fits at 256.
    assert home_cells(sized) == {0: 64, 1: 128, 2: 128, 3: 256, 4: 512}
    base, grid = (clue_eval_grid(c, tokenizer=tok, corpus=corpus) for c in (small, sized))
    pairs = Counter(zip(grid.column("length_target").to_pylist(), grid.column("bucket").to_pylist()))
    home = home_cells(sized)
    assert {cell: n // 2 for cell, n in pairs.items()} == {
        (length, b): sized.eval_pairs_per_bucket[b] if home[b] == length else 1 for length, b in eval_cells(sized)}
    first = {}
    for row in _rows(grid):
        first.setdefault((row["length_target"], row["bucket"], row["variant"]), row["prompt_ids"])
    assert all(first[(r["length_target"], r["bucket"], r["variant"])] == r["prompt_ids"] for r in _rows(base))


def test_config_errors():
    with pytest.raises(ValueError, match="eval_pairs_per_bucket needs one count >= 1 per distance bucket"):
        CluesConfig(eval_pairs_per_bucket=(8, 8))
    with pytest.raises(ValueError, match="eval_pairs_per_bucket"):
        CluesConfig(eval_pairs_per_bucket=(8, 8, 0, 8, 8))
    with pytest.raises(ValueError, match="max_clues"):
        CluesConfig(max_clues=5)
    with pytest.raises(ValueError, match="distance_edges"):
        CluesConfig(distance_edges=(10, 20))
    with pytest.raises(ValueError, match="kinds"):
        CluesConfig(kinds=("lookup",))


def test_recall_with_single_token_names(cfg, tok, heldout_filler):
    """The tiny profile's task: one-token names and one-digit values, every clue needed, distractors
    of the needed clues' exact form, and a control twin with the same tokens."""
    clues = replace(cfg.clues, kinds=("recall",), single_token_names=True, value_max=9, max_clues=4,
                    max_distractors=4)
    for i, bucket in enumerate([(0, 32), (300, 400)]):
        s, c = make_example(clues, tok, heldout_filler, 512, rng(2, i), bucket, "recall", 2 + 2 * i)
        assert bucket[0] <= s.distance < bucket[1]
        assert needs_every_clue(tok, s) and needs_every_clue(tok, c)
        assert Counter(s.input_ids.tolist()) == Counter(c.input_ids.tolist())
        text = decode(tok, s.input_ids[: s.answer_start])
        statements = _STATEMENT_RE.findall(text)
        assert len(statements) == 2 + 2 * i + s.n_distractors and s.n_distractors > 0
        for name, _, value in statements:
            assert len(tok.encode(" " + name).ids) == 1 and value.isdigit() and len(value) == 1
        assert s.answer.count("=") == 2 + 2 * i


def test_compact_statements(cfg, tok, heldout_filler):
    """`B=5.` statements and a `B=5, F=3` answer: the solver reads them, every clue is still needed,
    distractors have the same compact form, and the control twin keeps the tokens."""
    clues = replace(cfg.clues, kinds=("recall",), single_token_names=True, value_max=9, max_clues=4,
                    max_distractors=4, compact_statements=True)
    s, c = make_example(clues, tok, heldout_filler, 256, rng(5, 0), (100, 200), "recall", 3)
    assert needs_every_clue(tok, s) and needs_every_clue(tok, c)
    assert Counter(s.input_ids.tolist()) == Counter(c.input_ids.tolist())
    statements = _STATEMENT_RE.findall(decode(tok, s.input_ids[: s.answer_start]))
    assert len(statements) == 3 + s.n_distractors and {sep for _, sep, _ in statements} == {"="}
    assert " = " not in s.answer and s.answer.count("=") == 3
    assert solve(" B=5. text Q7=2. A=9.\nQuestion: What are A, B?\nAnswer:") == "A=9, B=5"
