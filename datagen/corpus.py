"""Text and code corpus from material present offline on every machine, with a held-out split.

Three sources, one row per document:
- `stdlib_code`: the running interpreter's standard-library `.py` files (tests, bundled packages,
  codec tables and the pydoc topic dump left out), long files cut at line boundaries into chunks of at
  most `max_doc_chars`;
- `stdlib_doc`: each selected file's module, class and function docstrings (via `ast`), in source order;
- `prose`: documents from `datagen.prose`'s template grammar.

Files are taken in a seeded permutation of their sorted paths until `stdlib_chars` characters of
source are collected. A document goes to the held-out split when a hash of (seed, its file path or
prose id) falls below `heldout_fraction`, so a file's code and docstrings always land in the same split
and the splits stay disjoint. Rows are in a seeded shuffle of all documents.

Determinism: same config and same Python standard library → same table. The standard library differs
between Python versions, so the table's metadata records the interpreter version and a sha256 over the
selected files' contents (`stdlib_fingerprint`); compare those when two machines disagree.
"""

from __future__ import annotations

import ast
import hashlib
import os
import platform
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

from datagen.io import with_metadata
from datagen.prose import generate_document
from datagen.seeding import rng, stable_fraction

SPLITS = ("train", "heldout")
SOURCES = ("stdlib_code", "stdlib_doc", "prose")

# Directories whose files are not useful prose or code to learn from: test suites (huge, repetitive),
# third-party packages (differ per machine), codec tables (hex dumps) and the pydoc topic dump.
_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings",
     "pydoc_data"}
)
_MIN_DOCSTRING_CHARS = 20


@dataclass(frozen=True)
class CorpusConfig:
    seed: int = 0
    # Characters of standard-library source to read; files are added whole until this is reached.
    stdlib_chars: int = 6_000_000
    prose_docs: int = 2000
    heldout_fraction: float = 0.05
    max_doc_chars: int = 16_000

    def __post_init__(self):
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.stdlib_chars < 0 or self.prose_docs < 0:
            raise ValueError("stdlib_chars and prose_docs must be >= 0")
        if self.stdlib_chars == 0 and self.prose_docs == 0:
            raise ValueError("the corpus would be empty: set stdlib_chars or prose_docs above 0")
        if self.max_doc_chars < 256:
            raise ValueError(f"max_doc_chars must be at least 256, got {self.max_doc_chars}")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(posix relative path, absolute path) of the usable standard-library files, sorted by path."""
    root = stdlib_root() if root is None else root
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning here keeps the walk out of site-packages, which can be far larger than the stdlib.
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    return found


def _chunks(source: str, max_chars: int) -> list[str]:
    """Cut `source` at line boundaries into pieces of at most `max_chars` (a longer line is cut too)."""
    pieces, current, size = [], [], 0
    for line in source.splitlines(keepends=True):
        while len(line) > max_chars:
            pieces.append(line[:max_chars])
            line = line[max_chars:]
        if size + len(line) > max_chars and current:
            pieces.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        pieces.append("".join(current))
    return [p for p in pieces if p.strip()]


def docstrings(source: str) -> list[str]:
    """Module, class and function docstrings of `source` in source order (empty if it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) >= _MIN_DOCSTRING_CHARS:
                found.append((getattr(node, "lineno", 0), doc))
    found.sort(key=lambda item: item[0])
    return [doc for _, doc in found]


def build_corpus(cfg: CorpusConfig) -> pa.Table:
    """The corpus table: columns doc_id, source, split, text (see the module docstring)."""
    rows: list[tuple[str, str, str, str]] = []
    fingerprint = hashlib.sha256()

    files = stdlib_files()
    order = rng(cfg.seed, "corpus", "files").permutation(len(files)) if files else []
    total = 0
    for i in order:
        if total >= cfg.stdlib_chars:
            break
        rel, path = files[int(i)]
        try:
            source = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        total += len(source)
        fingerprint.update(rel.encode() + b"\0" + hashlib.sha256(source.encode()).digest())
        split = "heldout" if stable_fraction(cfg.seed, rel) < cfg.heldout_fraction else "train"
        for k, piece in enumerate(_chunks(source, cfg.max_doc_chars)):
            rows.append((f"stdlib/{rel}#code{k}", "stdlib_code", split, piece))
        docs = "\n\n".join(docstrings(source))
        for k, piece in enumerate(_chunks(docs, cfg.max_doc_chars)):
            rows.append((f"stdlib/{rel}#doc{k}", "stdlib_doc", split, piece))

    prose_rng = rng(cfg.seed, "corpus", "prose")
    for i in range(cfg.prose_docs):
        doc_id = f"prose/{i:06d}"
        split = "heldout" if stable_fraction(cfg.seed, doc_id) < cfg.heldout_fraction else "train"
        rows.append((doc_id, "prose", split, generate_document(prose_rng)))

    if not rows:
        raise ValueError(
            f"no corpus documents: found {len(files)} standard-library files under {stdlib_root()} "
            "and prose_docs=0; raise prose_docs"
        )
    shuffle = rng(cfg.seed, "corpus", "rows").permutation(len(rows))
    rows = [rows[int(i)] for i in shuffle]
    table = pa.table(
        {
            "doc_id": pa.array([r[0] for r in rows], pa.string()),
            "source": pa.array([r[1] for r in rows], pa.string()),
            "split": pa.array([r[2] for r in rows], pa.string()),
            "text": pa.array([r[3] for r in rows], pa.large_string()),
        }
    )
    return with_metadata(
        table,
        {
            "generator": "corpus",
            "config": asdict(cfg),
            "python_version": platform.python_version(),
            "stdlib_chars_read": total,
            "stdlib_fingerprint": fingerprint.hexdigest(),
        },
    )


def split_texts(corpus: pa.Table, split: str, sources: tuple[str, ...] = SOURCES) -> list[str]:
    """Texts of one split (in corpus order), optionally only from some sources."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown corpus sources {sorted(unknown)}; valid: {SOURCES}")
    return [
        text
        for s, src, text in zip(
            corpus.column("split").to_pylist(),
            corpus.column("source").to_pylist(),
            corpus.column("text").to_pylist(),
        )
        if s == split and src in sources
    ]
