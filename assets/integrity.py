"""Verification on read: an upstream's files must still be the bytes its materialization recorded.

The data assets are content-addressed (`data/<profile>/<asset>/<sha256[:16]>/`), and the recorded
data version *is* the file's sha256; a checkpoint's data version is the sha256 of its weights, and
its manifest lists the hash of every file. Before this check, 256 flipped bytes in `corpus.parquet`
surfaced as `OSError: Unexpected end of stream` naming no file, and a `tokenizer.json` edited into
another valid tokenizer was used silently. Now every read through `require_upstreams` re-hashes
first, and any damage or read error names the file and what to re-materialize. Re-materializing
replaces the damaged file (`assets/storage.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from k3model.checkpoint import CheckpointCorrupted, sha256_file, verify_checkpoint

if TYPE_CHECKING:
    from assets.lineage import Upstream


def upstream_problem(up: "Upstream") -> str | None:
    """What is wrong with an upstream's files (damaged, unreadable), or None when they verify."""
    try:
        if up.path.is_dir():
            actual = verify_checkpoint(up.path).sha256
            what = f"checkpoint {up.path}"
        else:
            actual = sha256_file(up.path)
            what = f"file {up.path}"
    except CheckpointCorrupted as e:
        return str(e)
    except OSError as e:
        return f"cannot read {e.filename or up.path}: {e.strerror or e}"
    expected = up.metadata.get("sha256") or up.data_version
    if expected and actual != expected:
        return (f"{what} is damaged: its sha256 is {actual} but its materialization (run "
                f"{up.run_id[:8]}) recorded {expected}")
    return None


def verify_upstreams(me: str, ups: dict[str, "Upstream"], profile: str) -> None:
    """A Failure naming every damaged or unreadable upstream and how to rebuild it."""
    problems = {name: p for name, up in ups.items() if (p := upstream_problem(up)) is not None}
    if problems:
        what = [f"cannot start from {n}: {p}" if ups[n].path.is_dir() else f"{me} cannot run: {n}: {p}"
                for n, p in problems.items()]
        raise dg.Failure(
            description="; ".join(what) + f". Re-materialize {', '.join(problems)} (`k3 run --profile "
                        f"{profile} --select {','.join(problems)}`, which replaces damaged files, or "
                        "Materialize in the UI)",
            allow_retries=False)
