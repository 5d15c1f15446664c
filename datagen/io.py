"""Deterministic Parquet writing, reading and content hashing for the data generators.

Every generator in `datagen/` returns a `pyarrow.Table`; `write_parquet` turns it into a file whose
bytes depend only on the table and on the installed pyarrow version (the writer stamps its version in
the footer), never on the time, the machine or the thread count. The file's sha256 is the asset's data
version, so "same config → same bytes" is checked by comparing `write_parquet`'s return values.

Choices that keep the bytes fixed: no pandas metadata (tables are built from plain arrays), a fixed
compression codec and level, a fixed row-group size, dictionary encoding on, statistics on, and schema
metadata serialized as JSON with sorted keys. The file is written to a temporary name beside the target
and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# Rows per row group: large enough that small tables are one group, small enough that a reader of the
# 16K-token eval grid does not have to decode everything at once.
ROW_GROUP_SIZE = 4096
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 3
METADATA_KEY = b"datagen"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def with_metadata(table: pa.Table, metadata: dict) -> pa.Table:
    """Attach `metadata` (JSON-serializable, e.g. the generator's config) under the `datagen` key."""
    payload = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()
    existing = dict(table.schema.metadata or {})
    existing[METADATA_KEY] = payload
    return table.replace_schema_metadata(existing)


def table_metadata(table_or_schema: pa.Table | pa.Schema) -> dict:
    """The `datagen` metadata that `with_metadata` attached (an empty dict if there is none)."""
    schema = table_or_schema.schema if isinstance(table_or_schema, pa.Table) else table_or_schema
    raw = (schema.metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else {}


def _publish(tmp: str, path: Path) -> None:
    # mkstemp creates files readable by the owner only; data files are meant to be shared.
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_parquet(table: pa.Table, path: str | os.PathLike) -> str:
    """Write `table` to `path` atomically with fixed writer settings; return the file's sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(
            table,
            tmp,
            row_group_size=ROW_GROUP_SIZE,
            compression=COMPRESSION,
            compression_level=COMPRESSION_LEVEL,
            use_dictionary=True,
            write_statistics=True,
            version="2.6",
            data_page_version="1.0",
        )
        _publish(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return sha256_file(path)


def read_parquet(path: str | os.PathLike) -> pa.Table:
    return pq.read_table(path)


def write_text(text: str, path: str | os.PathLike) -> str:
    """Write UTF-8 text atomically (used for tokenizer.json); return the file's sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode("utf-8"))
    _publish(tmp, path)
    return sha256_file(path)
