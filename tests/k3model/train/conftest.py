"""A smoke tokenizer and a small fixed demonstration set for the trainer tests (about 3 s, once)."""

from __future__ import annotations

import pytest

from datagen.corpus import build_corpus
from datagen.profiles import presets
from datagen.sft import SFTDataConfig, build_sft
from datagen.tokenizer import train_tokenizer


@pytest.fixture(scope="session")
def smoke_tok():
    cfg = presets("smoke")
    return train_tokenizer(cfg.tokenizer, build_corpus(cfg.corpus))


@pytest.fixture(scope="session")
def demos(smoke_tok):
    # Two arithmetic tasks at three efforts: six rows of ~600 tokens, the shortest episodes.
    return build_sft(SFTDataConfig(tasks_per_family=2, families=("arith_word",)), smoke_tok)
