"""datagen.io: deterministic Parquet bytes, metadata round trip, atomic writes."""

import pyarrow as pa

from datagen.io import read_parquet, sha256_bytes, sha256_file, table_metadata, with_metadata, write_parquet


def _table(n=1000):
    return pa.table({"a": pa.array(range(n), pa.int32()), "s": pa.array([f"row {i}" for i in range(n)])})


def test_same_table_same_bytes(tmp_path):
    t = with_metadata(_table(), {"b": 1, "a": [1, 2]})
    h1 = write_parquet(t, tmp_path / "one.parquet")
    h2 = write_parquet(t, tmp_path / "two.parquet")
    assert h1 == h2 == sha256_file(tmp_path / "one.parquet")
    assert (tmp_path / "one.parquet").read_bytes() == (tmp_path / "two.parquet").read_bytes()


def test_different_table_different_bytes(tmp_path):
    a = write_parquet(_table(1000), tmp_path / "a.parquet")
    assert a != write_parquet(_table(999), tmp_path / "b.parquet")


def test_metadata_round_trip_and_no_temp_files(tmp_path):
    path = tmp_path / "sub" / "t.parquet"
    write_parquet(with_metadata(_table(), {"config": {"seed": 3}}), path)
    back = read_parquet(path)
    assert table_metadata(back) == {"config": {"seed": 3}}
    assert back.column("a").to_pylist() == list(range(1000))
    assert [p.name for p in path.parent.iterdir()] == ["t.parquet"]
    assert path.stat().st_mode & 0o777 == 0o644


def test_sha256_bytes():
    assert sha256_bytes(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
