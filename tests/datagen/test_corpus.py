"""datagen.corpus: sources, disjoint held-out split, chunking, seeds."""

from dataclasses import replace

import pytest

from datagen.corpus import SOURCES, CorpusConfig, _chunks, build_corpus, docstrings, split_texts, stdlib_files
from datagen.io import table_metadata


def test_sources_and_columns(corpus, cfg):
    rows = corpus.to_pylist()
    assert {r["source"] for r in rows} == set(SOURCES)
    assert sum(r["source"] == "prose" for r in rows) == cfg.corpus.prose_docs
    assert all(r["text"].strip() for r in rows)
    assert len({r["doc_id"] for r in rows}) == len(rows)
    meta = table_metadata(corpus)
    assert meta["config"]["seed"] == cfg.corpus.seed
    assert len(meta["stdlib_fingerprint"]) == 64


def test_heldout_split_is_disjoint_by_file(corpus):
    # A file's code and docstrings share a split, so no held-out text leaks through its docstrings.
    split_of: dict[str, set[str]] = {}
    for doc_id, split in zip(corpus.column("doc_id").to_pylist(), corpus.column("split").to_pylist()):
        split_of.setdefault(doc_id.split("#")[0], set()).add(split)
    assert all(len(s) == 1 for s in split_of.values())
    splits = [next(iter(s)) for s in split_of.values()]
    assert 0 < splits.count("heldout") < splits.count("train")
    train, heldout = set(split_texts(corpus, "train")), set(split_texts(corpus, "heldout"))
    assert train.isdisjoint(heldout)


def test_no_test_suites_or_site_packages():
    for rel, _ in stdlib_files():
        parts = rel.split("/")[:-1]
        assert not {"test", "tests", "site-packages", "encodings"} & set(parts), rel


def test_chunks_keep_lines_and_bound_size():
    source = "".join(f"line {i} " + "x" * (i % 50) + "\n" for i in range(2000))
    pieces = _chunks(source, 1000)
    assert "".join(pieces) == source
    assert max(map(len, pieces)) <= 1000
    assert all(p.endswith("\n") for p in pieces)


def test_docstrings_in_source_order():
    src = '"""Module doc long enough."""\nclass A:\n    """Class doc long enough here."""\n' \
          '    def f(self):\n        """Function doc long enough here."""\n'
    assert docstrings(src) == ["Module doc long enough.", "Class doc long enough here.",
                               "Function doc long enough here."]
    assert docstrings("def broken(:\n") == []


def test_seed_changes_the_corpus(cfg):
    small = replace(cfg.corpus, stdlib_chars=60_000, prose_docs=20)
    a, b = build_corpus(small), build_corpus(replace(small, seed=1))
    assert a.column("doc_id").to_pylist() != b.column("doc_id").to_pylist()
    assert a.equals(build_corpus(small))


def test_config_errors():
    with pytest.raises(ValueError, match="heldout_fraction"):
        CorpusConfig(heldout_fraction=0.0)
    with pytest.raises(ValueError, match="empty"):
        CorpusConfig(stdlib_chars=0, prose_docs=0)
    with pytest.raises(ValueError, match="split"):
        split_texts(build_corpus(CorpusConfig(stdlib_chars=0, prose_docs=3)), "validation")
