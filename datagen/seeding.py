"""Random streams derived from a config seed and string/int tags, identical on every machine.

Each generator draws from `rng(seed, "clues", length, bucket, ...)`, so a stream depends only on the
seed and on what it is for: adding a new eval cell or a new generator never shifts the numbers another
one sees. Python's `hash()` is salted per process, so string tags go through CRC-32 instead.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np


def _tag_to_int(tag: str | int) -> int:
    if isinstance(tag, bool) or not isinstance(tag, (str, int)):
        raise TypeError(f"rng tags must be str or int, got {type(tag).__name__}")
    if isinstance(tag, int):
        if tag < 0:
            raise ValueError(f"rng tags must be non-negative, got {tag}")
        return tag
    return zlib.crc32(tag.encode("utf-8"))


def rng(seed: int, *tags: str | int) -> np.random.Generator:
    """A PCG64 generator seeded by (seed, *tags)."""
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    return np.random.default_rng(np.random.SeedSequence([seed, *(_tag_to_int(t) for t in tags)]))


def stable_fraction(seed: int, key: str) -> float:
    """A number in [0, 1) fixed by (seed, key): used to assign documents to splits independently of order."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
