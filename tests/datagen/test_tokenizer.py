"""datagen.tokenizer: byte-level round trip, special tokens as single fixed ids, deterministic training."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datagen.tokenizer import (
    IMAGE,
    SPECIAL_TOKENS,
    TokenizerConfig,
    decode,
    encode,
    special_token_ids,
    tokenizer_from_json,
    tokenizer_to_json,
    train_tokenizer,
)

SAMPLES = [
    "def forward(self, x):\n\treturn x  # comment\n",
    "X7 = 42. Q3 = X7.\nQuestion: What is Q3?\nAnswer: 42",
    "Ünïcödé — 日本語のテキスト, emoji 🙂 and\r\nwindows line ends",
    "   leading and trailing spaces   ",
    "",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_samples(tok, text):
    assert decode(tok, encode(tok, text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_round_trip_any_text(tok, text):
    assert decode(tok, encode(tok, text)) == text


def test_special_tokens_have_fixed_single_ids(tok):
    ids = special_token_ids(tok)
    assert list(ids.values()) == list(range(len(SPECIAL_TOKENS)))
    for token, i in ids.items():
        encoded = encode(tok, f"before {token} after")
        assert encoded.count(i) == 1, token
        assert decode(tok, encoded) == f"before {token} after"


def test_image_placeholders_stay_one_id_each(tok):
    i = tok.token_to_id(IMAGE)
    assert encode(tok, IMAGE * 4) == [i] * 4


def test_digits_are_single_tokens(tok):
    # Each digit is its own token, so a number's tokens do not depend on corpus statistics.
    for number in ("7", "42", "31415"):
        ids = encode(tok, number)
        assert len(ids) == len(number)
        assert [decode(tok, [t]) for t in ids] == list(number)


def test_vocab_size_and_deterministic_training(cfg, corpus, tok):
    assert tok.get_vocab_size() == cfg.tokenizer.vocab_size
    again = train_tokenizer(cfg.tokenizer, corpus)
    assert tokenizer_to_json(again) == tokenizer_to_json(tok)
    assert tokenizer_to_json(tokenizer_from_json(tokenizer_to_json(tok))) == tokenizer_to_json(tok)


def test_config_errors():
    with pytest.raises(ValueError, match="at least"):
        TokenizerConfig(vocab_size=100)
