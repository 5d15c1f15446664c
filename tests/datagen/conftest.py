"""Shared smoke-profile data for the datagen tests, built once per session (about 2 s)."""

from __future__ import annotations

import pytest

from datagen.clues import build_filler
from datagen.corpus import build_corpus
from datagen.images import build_images
from datagen.profiles import presets
from datagen.tokenizer import train_tokenizer


@pytest.fixture(scope="session")
def cfg():
    return presets("smoke")


@pytest.fixture(scope="session")
def corpus(cfg):
    return build_corpus(cfg.corpus)


@pytest.fixture(scope="session")
def tok(cfg, corpus):
    return train_tokenizer(cfg.tokenizer, corpus)


@pytest.fixture(scope="session")
def images(cfg):
    return build_images(cfg.images)


@pytest.fixture(scope="session")
def train_filler(corpus, tok):
    return build_filler(corpus, tok, "train")


@pytest.fixture(scope="session")
def heldout_filler(corpus, tok):
    return build_filler(corpus, tok, "heldout")
