"""Byte-level BPE tokenizer trained with Hugging Face `tokenizers` on the corpus's train split.

Pipeline: no normalizer (bytes are kept exactly) → pre-tokenizer `Digits(individual_digits=True)` then
GPT-2 `ByteLevel` (regex split, bytes mapped to printable code points) → BPE merges learned to
`vocab_size` → `ByteLevel` decoder. Every byte is in the initial alphabet, so any string round-trips:
`decode(encode(s).ids) == s`.

Digits are split one per token: a number's tokens then never depend on which digit strings happened
to be frequent in the corpus, so "42" is always `4`, `2` and the scattered-clue answers are short,
exactly checkable token sequences a tiny model can learn to copy.

The special tokens below are added first and therefore take ids 0..len(SPECIAL_TOKENS)-1 in this
order, whatever the vocabulary size; each encodes to a single id wherever it appears in text. They
cover: document boundaries and padding, chat roles and turn end, tool calls and tool results, thinking
spans, <|image|> slots (`<|image|>` is repeated once per vision token after the encoder's 2×2
merge), and the three reasoning-effort levels of K3's post-training.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD = "<|pad|>"
BOS = "<|bos|>"
EOS = "<|eos|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END_OF_TURN = "<|end|>"
TOOL_CALL = "<|tool_call|>"
TOOL_CALL_END = "<|tool_call_end|>"
TOOL_RESULT = "<|tool_result|>"
TOOL_RESULT_END = "<|tool_result_end|>"
THINK = "<|think|>"
THINK_END = "<|think_end|>"
IMAGE_START = "<|image_start|>"
IMAGE = "<|image|>"
IMAGE_END = "<|image_end|>"
EFFORT_LOW = "<|effort_low|>"
EFFORT_HIGH = "<|effort_high|>"
EFFORT_MAX = "<|effort_max|>"

# Order fixes the ids: appending is safe, reordering changes every trained model's embedding rows.
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD,
    BOS,
    EOS,
    SYSTEM,
    USER,
    ASSISTANT,
    END_OF_TURN,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESULT,
    TOOL_RESULT_END,
    THINK,
    THINK_END,
    IMAGE_START,
    IMAGE,
    IMAGE_END,
    EFFORT_LOW,
    EFFORT_HIGH,
    EFFORT_MAX,
)
EFFORT_TOKENS: dict[str, str] = {"low": EFFORT_LOW, "high": EFFORT_HIGH, "max": EFFORT_MAX}

# 256 byte symbols + the special tokens: a smaller vocabulary would leave no room for a single merge.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + 1


@dataclass(frozen=True)
class TokenizerConfig:
    vocab_size: int = 4096
    # A pair must occur this often to be merged; 2 keeps one-off strings from taking vocabulary slots.
    min_frequency: int = 2
    # Train on at most this many characters of the train split (in corpus order): BPE merges settle
    # long before the whole corpus is read, and this bounds training time.
    train_chars: int = 4_000_000

    def __post_init__(self):
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(
                f"vocab_size={self.vocab_size} is too small: it must be at least {MIN_VOCAB_SIZE} "
                f"(256 bytes + {len(SPECIAL_TOKENS)} special tokens + 1 merge)"
            )
        if self.min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {self.min_frequency}")
        if self.train_chars < 1:
            raise ValueError(f"train_chars must be positive, got {self.train_chars}")


def _training_texts(corpus: pa.Table, train_chars: int) -> list[str]:
    """The train split's texts in corpus order, cut at `train_chars` characters in total."""
    texts, total = [], 0
    for split, text in zip(corpus.column("split").to_pylist(), corpus.column("text").to_pylist()):
        if split != "train":
            continue
        take = text[: train_chars - total]
        texts.append(take)
        total += len(take)
        if total >= train_chars:
            break
    if not texts:
        raise ValueError("the corpus has no rows with split == 'train' to train the tokenizer on")
    return texts


def train_tokenizer(cfg: TokenizerConfig, corpus: pa.Table) -> Tokenizer:
    """Train the byte-level BPE tokenizer on the corpus's train split (see module docstring)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_texts(corpus, cfg.train_chars), trainer)
    check_special_tokens(tok)
    return tok


def tokenizer_to_json(tok: Tokenizer) -> str:
    """The tokenizer's serialized form; its sha256 is the tokenizer asset's data version."""
    return tok.to_str(pretty=False)


def tokenizer_from_json(text: str) -> Tokenizer:
    tok = Tokenizer.from_str(text)
    check_special_tokens(tok)
    return tok


def load_tokenizer(path) -> Tokenizer:
    tok = Tokenizer.from_file(str(path))
    check_special_tokens(tok)
    return tok


def special_token_ids(tok: Tokenizer) -> dict[str, int]:
    """Map each special token string to its id (ids are 0..len(SPECIAL_TOKENS)-1 in order)."""
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def check_special_tokens(tok: Tokenizer) -> None:
    """Raise ValueError unless every special token has the id its position in SPECIAL_TOKENS gives."""
    for expected, token in enumerate(SPECIAL_TOKENS):
        got = tok.token_to_id(token)
        if got != expected:
            raise ValueError(
                f"tokenizer maps {token} to id {got}, expected {expected}: it was not trained by "
                "datagen.train_tokenizer with the current SPECIAL_TOKENS; retrain it"
            )


def encode(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def encode_batch(tok: Tokenizer, texts: Iterable[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def decode(tok: Tokenizer, ids: Iterable[int]) -> str:
    """Decode ids to text, special tokens included, so that decode(encode(s)) == s."""
    return tok.decode(list(ids), skip_special_tokens=False)
