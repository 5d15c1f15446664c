"""Publishing a data asset's files: staged, renamed into a content-addressed directory, and
replacing whatever damaged copy was there.

    <data>/<profile>/<asset>/.staging-<random>/    written here first
    <data>/<profile>/<asset>/<sha256[:16]>/        then renamed to this

The directory is named by the main file's hash, so rebuilding unchanged data lands on the same
name. An existing directory used to be kept as it was, so re-materializing a damaged corpus reported
success with the good version while the damaged file stayed on disk. Now it is kept only if it holds
the same files and its main file still has that hash; otherwise it is swapped for the new one.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from k3model.checkpoint import sha256_file


def _intact(directory: Path, staged: Path, filename: str, sha: str) -> bool:
    try:
        same_names = {p.name for p in directory.iterdir()} == {p.name for p in staged.iterdir()}
        return same_names and sha256_file(directory / filename) == sha
    except OSError:
        return False


def publish(asset_dir: Path, filename: str, write: Callable[[Path], str],
            extra: Callable[[Path], None] | None = None) -> tuple[Path, str]:
    """Write `filename` (with `write`, which returns its sha256) and optionally more files (`extra`)
    into `<asset_dir>/<sha256[:16]>/` atomically; (path of the file, sha256)."""
    staging = asset_dir / f".staging-{uuid.uuid4().hex[:12]}"
    staging.mkdir(parents=True)
    try:
        sha = write(staging / filename)
        if extra is not None:
            extra(staging)
        final = asset_dir / sha[:16]
        if final.exists() and _intact(final, staging, filename, sha):
            shutil.rmtree(staging)  # the same bytes are already stored
        elif final.exists():
            # os.replace cannot swap a non-empty directory: move the damaged one aside first.
            old = asset_dir / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final / filename, sha
