"""Scattered-clue long-context data: clues far apart in real text, distractors, one question needing all.

K3's long-context curriculum trains on sequences where "Clue A, a long gap, Clue B, another gap,
Clue C, another gap, then a question that requires combining A, B and C". This module makes such
sequences at an exact token length, in the style of RULER's variable tracking and BABILong's facts in
a haystack (research/recipe.md §9):

    <|bos|> filler … X7 = 42. … filler … K3 = 17. … Q3 = X7. … filler … M5 = Q3. … filler
    \\nQuestion: What is M5?\\nAnswer: 42<|eos|>

Task kinds (every needed clue is a statement `NAME = VALUE.` or `NAME = NAME.`):
- `chain` — multi-hop variable tracking: `v1 = x. v2 = v1. … vk = v(k-1).`, question "What is vk?",
  answer x. Dropping any link leaves vk undefined.
- `sum` — aggregation: `v1 = x1. … vk = xk.`, question "What is v1 + … + vk?" (names in a random
  order), answer Σ xi. Dropping any term leaves the sum undefined.
- `recall` — multi-key retrieval (RULER's multi-key NIAH): `v1 = x1. … vk = xk.`, question "What are
  v3, v1, …?" (every needed name, in a random order), answer "v3 = x3, v1 = x1, …" in the question's
  order (no final period, so an answer never reads as a statement).
  Dropping any clue leaves its value undefined. One lookup per clue and no arithmetic: the kind a
  2–3M-parameter model can learn (issue 17), still needing every clue.
with k = n_clues in [min_clues, max_clues]. Distractors are chains of the same surface form over
fresh names (one chain may reuse the answer's value as a lure; for `recall` every distractor is one
`NAME = VALUE.` statement, the needed clues' exact form), placed anywhere in the filler.
`single_token_names` draws names only from those the tokenizer writes as one token after a space
(single capital letters in the byte-level BPE), and `value_max = 9` keeps each value one digit
token: what a name or value is then never spans tokens, which a tiny model otherwise has to learn
first.

Geometry (token positions; `distance` is what the eval grid is bucketed by):
    distance = question_start − end of the first (farthest) needed clue
The needed clues appear in chain order; clue 1 is placed to hit the requested distance, the others
between it and the question; clues and distractors go between filler sentences when that can hit the
distance bucket, else clue 1 goes at a token offset inside a sentence. Filler is consecutive
sentences of the corpus's docstrings and generated prose (train split for training examples,
held-out split for evaluation), with sentences containing "=" removed so no filler reads as a clue.

The control variant of an example keeps every token and moves only the needed clues, in order, to
just before the question: same token multiset and length, distance = the other clues' lengths.

`solve(text)` is the generator's own checker: it parses every statement in the text and answers the
question, or returns None when the statements do not determine the answer; `needs_every_clue` checks
that removing any one needed clue makes the answer undetermined.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from datagen.corpus import split_texts
from datagen.io import with_metadata
from datagen.seeding import rng as make_rng
from datagen.tokenizer import BOS, EOS, decode, encode, encode_batch

KINDS = ("chain", "sum", "recall")
VARIANTS = ("scattered", "control")

_NAME = r"[A-Z][0-9]{0,2}"
# A statement is `NAME = VALUE.`, or `NAME=VALUE.` with compact_statements; group 2 is the separator.
_STATEMENT_RE = re.compile(rf"(?<![A-Za-z0-9])({_NAME})( = |=)({_NAME}|[0-9]+)\.")
_QUESTION_RE = re.compile(
    rf"\nQuestion: What (?:is ({_NAME}(?: \+ {_NAME})*)|are ({_NAME}(?:, {_NAME})+))\?\nAnswer:")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_NAMES = tuple(f"{a}{n}" for a in _LETTERS for n in range(1, 100))
# Candidates for single_token_names: bare letters first, then letter-digit names.
_SHORT_NAMES = tuple(_LETTERS) + _NAMES
# Attempts per example before a cell is declared infeasible (a new filler window and layout each time).
_MAX_ATTEMPTS = 64


@dataclass(frozen=True)
class CluesConfig:
    seed: int = 0
    # The pretraining stages' context lengths; the eval grid has one row of cells per length.
    context_lengths: tuple[int, ...] = (128, 1024, 4096, 16384)
    # Distance bucket edges in tokens: bucket i is [edges[i], edges[i+1]).
    distance_edges: tuple[int, ...] = (0, 64, 512, 2048, 8192, 16384)
    kinds: tuple[str, ...] = KINDS
    min_clues: int = 2
    max_clues: int = 4
    # Chain values are drawn from [0, value_max]; sum terms from [0, sum_term_max].
    value_max: int = 99
    sum_term_max: int = 9
    # Distractor statements per example: round(length/1000 * per_1k), clamped to [min, max].
    distractors_per_1k: float = 4.0
    min_distractors: int = 2
    max_distractors: int = 32
    # Examples per (length, bucket) eval cell, each with its control twin.
    eval_per_cell: int = 16
    # Pairs in each distance bucket's home cell, one number per bucket (empty: eval_per_cell
    # everywhere): the shortest length whose grid reaches the bucket (`home_cells`). Claim 1 needs
    # ~96 pairs per bucket for a ±0.1 interval, ~385 for ±0.05; at the shortest length they cost
    # least (an 8192-token row costs ~16× a 2048-token one on the CPU, docs/log/claim1.md), and
    # the bucket may be cut short there (tiny's [256, 1024) reaches 473 in 512-token rows).
    eval_pairs_per_bucket: tuple[int, ...] = ()
    # Names only from those the tokenizer encodes as one token after a space (see the module docstring).
    single_token_names: bool = False
    # Statements and recall answers written `B=5` instead of `B = 5` (see the module docstring).
    compact_statements: bool = False

    def __post_init__(self):
        if not self.context_lengths or list(self.context_lengths) != sorted(set(self.context_lengths)):
            raise ValueError(f"context_lengths must be strictly increasing, got {self.context_lengths}")
        e = self.distance_edges
        if len(e) < 2 or e[0] != 0 or list(e) != sorted(set(e)):
            raise ValueError(f"distance_edges must start at 0 and strictly increase, got {e}")
        bad = set(self.kinds) - set(KINDS)
        if not self.kinds or bad:
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {self.kinds}")
        if not 2 <= self.min_clues <= self.max_clues <= 4:
            raise ValueError(
                f"need 2 <= min_clues <= max_clues <= 4, got {self.min_clues}, {self.max_clues}"
            )
        if self.value_max < 1 or self.sum_term_max < 1:
            raise ValueError("value_max and sum_term_max must be >= 1")
        if not 0 <= self.min_distractors <= self.max_distractors:
            raise ValueError("need 0 <= min_distractors <= max_distractors")
        if self.eval_per_cell < 1:
            raise ValueError(f"eval_per_cell must be >= 1, got {self.eval_per_cell}")
        n_buckets = len(e) - 1
        if self.eval_pairs_per_bucket and (len(self.eval_pairs_per_bucket) != n_buckets
                                           or min(self.eval_pairs_per_bucket) < 1):
            raise ValueError(
                f"eval_pairs_per_bucket needs one count >= 1 per distance bucket ({n_buckets} for edges "
                f"{e}), got {self.eval_pairs_per_bucket}; or leave it empty"
            )


def distance_buckets(cfg: CluesConfig) -> list[tuple[int, int]]:
    e = cfg.distance_edges
    return [(e[i], e[i + 1]) for i in range(len(e) - 1)]


# ---------------------------------------------------------------------------------------------------
# Filler: consecutive real sentences, tokenized once per (tokenizer, split)
# ---------------------------------------------------------------------------------------------------

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+")
_PARAGRAPH_SPLIT = re.compile(r"\n\s*\n")


def _usable_sentence(s: str) -> bool:
    return (
        20 <= len(s) <= 300
        and " " in s
        and "=" not in s
        and "<|" not in s
        and ">>>" not in s
        and "Question" not in s
        and "Answer" not in s
    )


def filler_sentences(texts: list[str]) -> list[str]:
    """Sentences of `texts` in order, whitespace collapsed, those unusable as filler dropped."""
    out = []
    for text in texts:
        for para in _PARAGRAPH_SPLIT.split(text):
            flat = " ".join(para.split())
            out.extend(s for s in _SENTENCE_SPLIT.split(flat) if _usable_sentence(s))
    return out


@dataclass(frozen=True)
class Filler:
    """Tokenized filler sentences: sentence i is ids[starts[i]:starts[i+1]] (int32 token ids)."""

    ids: np.ndarray
    starts: np.ndarray

    @property
    def num_sentences(self) -> int:
        return len(self.starts) - 1


def build_filler(corpus: pa.Table, tokenizer: Tokenizer, split: str) -> Filler:
    """Filler from the docstrings and prose of one corpus split; each sentence keeps a leading space."""
    sentences = filler_sentences(split_texts(corpus, split, ("stdlib_doc", "prose")))
    if not sentences:
        raise ValueError(
            f"the corpus's {split!r} split has no usable filler sentences; raise prose_docs or "
            "stdlib_chars in the corpus config"
        )
    encoded = encode_batch(tokenizer, (" " + s for s in sentences))
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    starts = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    ids = np.fromiter((t for e in encoded for t in e), dtype=np.int32, count=int(starts[-1]))
    return Filler(ids=ids, starts=starts)


def _filler_window(filler: Filler, num_tokens: int, rng: np.random.Generator):
    """`num_tokens` consecutive filler tokens from a random sentence on (wrapping around the split),
    cut at the front so the window ends on a sentence end. Returns (ids, sentence boundary offsets)."""
    if num_tokens == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
    s = int(rng.integers(filler.num_sentences))
    pieces, total = [], 0
    while total < num_tokens:
        piece = filler.ids[filler.starts[s] : filler.starts[s + 1]]
        pieces.append(piece)
        total += len(piece)
        s = (s + 1) % filler.num_sentences
    excess = total - num_tokens
    while excess >= len(pieces[0]):
        excess -= len(pieces.pop(0))
    pieces[0] = pieces[0][excess:]
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return np.concatenate(pieces).astype(np.int32), bounds


# ---------------------------------------------------------------------------------------------------
# Problems: the statements, question and answer, as text
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    kind: str
    clues: tuple[str, ...]  # needed statements in order of appearance, each with a leading space
    distractors: tuple[tuple[str, ...], ...]  # distractor chains, statements in order
    question: str  # ends with "Answer:"
    answer: str  # with its leading space


def make_problem(cfg: CluesConfig, kind: str, n_clues: int, n_distractors: int, rng,
                 name_pool: tuple[str, ...] = _NAMES) -> Problem:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not 2 <= n_clues <= 4:
        raise ValueError(f"n_clues must be in [2, 4], got {n_clues}")
    if n_clues + n_distractors > len(name_pool):
        raise ValueError(
            f"{n_clues} clues and {n_distractors} distractors need {n_clues + n_distractors} distinct names "
            f"but the name pool has {len(name_pool)}; lower max_distractors"
        )
    names = [name_pool[int(i)] for i in rng.choice(len(name_pool), n_clues + n_distractors, replace=False)]
    needed, spare = names[:n_clues], names[n_clues:]
    eq = "=" if cfg.compact_statements else " = "
    vmax = cfg.sum_term_max if kind == "sum" else cfg.value_max
    if kind == "chain":
        x = int(rng.integers(0, vmax + 1))
        clues = [f" {needed[0]}{eq}{x}."] + [
            f" {needed[i]}{eq}{needed[i - 1]}." for i in range(1, n_clues)
        ]
        question = f"\nQuestion: What is {needed[-1]}?\nAnswer:"
        answer = x
    elif kind == "recall":
        xs = [int(v) for v in rng.integers(0, vmax + 1, size=n_clues)]
        clues = [f" {v}{eq}{x}." for v, x in zip(needed, xs)]
        order = [int(i) for i in rng.permutation(n_clues)]
        question = f"\nQuestion: What are {', '.join(needed[i] for i in order)}?\nAnswer:"
        # Each value follows its name, as in the clue: retrieving it is one associative lookup
        # ("name =" → the token after the earlier "name ="), the pattern small models learn first.
        answer = ", ".join(f"{needed[i]}{eq}{xs[i]}" for i in order)
    else:
        xs = [int(v) for v in rng.integers(0, vmax + 1, size=n_clues)]
        clues = [f" {v}{eq}{x}." for v, x in zip(needed, xs)]
        asked = [needed[int(i)] for i in rng.permutation(n_clues)]
        question = f"\nQuestion: What is {' + '.join(asked)}?\nAnswer:"
        answer = sum(xs)
    chains = []
    while spare:
        longest = 1 if kind == "recall" else cfg.max_clues
        k = min(len(spare), int(rng.integers(1, longest + 1)))
        chain_names, spare = spare[:k], spare[k:]
        # RULER-style lure: the first distractor chain of a chain problem carries the answer's value.
        value = answer if (kind == "chain" and not chains) else int(rng.integers(0, vmax + 1))
        chain = [f" {chain_names[0]}{eq}{value}."] + [
            f" {chain_names[i]}{eq}{chain_names[i - 1]}." for i in range(1, k)
        ]
        chains.append(tuple(chain))
    return Problem(kind, tuple(clues), tuple(chains), question, f" {answer}")


def solve(text: str) -> str | None:
    """Answer the last question in `text` from the statements before it; None if undetermined.

    A name assigned twice counts as undetermined, as does a reference to an unassigned name or a cycle.
    """
    questions = list(_QUESTION_RE.finditer(text))
    if not questions:
        return None
    q = questions[-1]
    assigned: dict[str, str] = {}
    written: dict[str, str] = {}  # each name's separator, for the recall answer's form
    conflicted: set[str] = set()
    for m in _STATEMENT_RE.finditer(text, 0, q.start()):
        name, rhs = m.group(1), m.group(3)
        if name in assigned:
            conflicted.add(name)
        assigned[name], written[name] = rhs, m.group(2)

    def value(name: str, seen: frozenset) -> int | None:
        if name in conflicted or name not in assigned or name in seen:
            return None
        rhs = assigned[name]
        return int(rhs) if rhs.isdigit() else value(rhs, seen | {name})

    if q.group(2) is not None:  # recall: every value, in the question's order
        names = q.group(2).split(", ")
        values = [value(name, frozenset()) for name in names]
        return None if None in values else ", ".join(f"{n}{written[n]}{v}" for n, v in zip(names, values))
    total = 0
    for name in q.group(1).split(" + "):
        v = value(name, frozenset())
        if v is None:
            return None
        total += v
    return str(total)


# ---------------------------------------------------------------------------------------------------
# Layout: filler + statements + question at an exact length and a controlled distance
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClueExample:
    """One sequence of exactly `length` tokens: input_ids = prompt + answer + <|eos|>."""

    kind: str
    variant: str
    input_ids: np.ndarray  # int32 [length]
    question_start: int
    answer_start: int
    answer_end: int  # answer tokens are input_ids[answer_start:answer_end]; <|eos|> follows
    clue_spans: tuple[tuple[int, int], ...]  # needed clues, in order; clue 1 is the farthest
    n_distractors: int
    answer: str  # without the leading space

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def distance(self) -> int:
        return self.question_start - self.clue_spans[0][1]


def _distances(p: np.ndarray, F: int, rest: int, d_off: np.ndarray, d_len: np.ndarray) -> np.ndarray:
    """Distance when clue 1 sits at filler offset p (after any distractor at the same offset)."""
    order = np.argsort(d_off, kind="stable")
    off_sorted, len_sorted = d_off[order], d_len[order]
    suffix = np.concatenate([np.cumsum(len_sorted[::-1])[::-1], [0]])
    after = suffix[np.searchsorted(off_sorted, p, side="right")]
    return (F - p) + rest + after


@dataclass(frozen=True)
class _Encoded:
    """A problem's pieces as token ids."""

    clues: list[np.ndarray]
    distractors: list[list[np.ndarray]]
    question: np.ndarray
    answer: np.ndarray

    @property
    def fixed_tokens(self) -> int:
        """Tokens besides filler: <|bos|>, statements, question, answer, <|eos|>."""
        statements = sum(map(len, self.clues)) + sum(len(d) for ch in self.distractors for d in ch)
        return 2 + statements + len(self.question) + len(self.answer)


def _encode_problem(problem: Problem, tokenizer: Tokenizer) -> _Encoded:
    def ids(text: str) -> np.ndarray:
        return np.array(encode(tokenizer, text), np.int32)

    return _Encoded(
        clues=[ids(c) for c in problem.clues],
        distractors=[[ids(s) for s in ch] for ch in problem.distractors],
        question=ids(problem.question),
        answer=ids(problem.answer),
    )


def _layout(
    problem: Problem,
    enc: _Encoded,
    tokenizer: Tokenizer,
    filler: Filler,
    length: int,
    bucket: tuple[int, int] | None,
    rng: np.random.Generator,
) -> tuple[ClueExample, ClueExample] | None:
    """The scattered example and its control twin, or None if this draw cannot meet the bucket."""
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    F = length - enc.fixed_tokens
    assert F >= 0, "make_example sheds distractors until the problem fits"
    window, bounds = _filler_window(filler, F, rng)

    # Distractor chains: each statement at a sentence boundary, a chain's statements in order.
    flat_dist = [d for ch in enc.distractors for d in ch]
    d_off = np.concatenate(
        [np.sort(rng.choice(bounds, size=len(ch))) for ch in enc.distractors]
        or [np.zeros(0, np.int64)]
    ).astype(np.int64)
    d_len = np.array([len(d) for d in flat_dist], dtype=np.int64)
    rest = sum(len(c) for c in enc.clues[1:])

    dist_at_bounds = _distances(bounds, F, rest, d_off, d_len)
    if bucket is not None:
        lo, hi = bucket
        ok = (dist_at_bounds >= lo) & (dist_at_bounds < hi)
        if ok.any():
            p1 = int(rng.choice(bounds[ok]))
        else:
            # No sentence boundary hits the bucket: put clue 1 inside a sentence.
            offsets = np.arange(F + 1, dtype=np.int64)
            dist_all = _distances(offsets, F, rest, d_off, d_len)
            ok = (dist_all >= lo) & (dist_all < hi)
            if not ok.any():
                return None
            p1 = int(rng.choice(offsets[ok]))
    else:
        # Training: a log-uniform target distance over what this layout can reach.
        d_min, d_max = int(dist_at_bounds.min()), int(dist_at_bounds.max())
        target = math.exp(rng.uniform(math.log1p(d_min), math.log1p(d_max))) - 1
        p1 = int(bounds[int(np.argmin(np.abs(dist_at_bounds - target)))])
    expected_distance = int(_distances(np.array([p1]), F, rest, d_off, d_len)[0])
    later = bounds[bounds >= p1]
    c_off = np.concatenate([[p1], np.sort(rng.choice(later, size=len(enc.clues) - 1))])

    # Segments inserted at each filler offset: distractors first, then needed clues in order.
    inserts: dict[int, list[tuple[str, int, np.ndarray]]] = {}
    for j, (o, d) in enumerate(zip(d_off, flat_dist)):
        inserts.setdefault(int(o), []).append(("distractor", j, d))
    for i, (o, c) in enumerate(zip(c_off, enc.clues)):
        inserts.setdefault(int(o), []).append(("clue", i, c))

    def assemble(move_clues: bool) -> ClueExample:
        parts, pos, prev = [np.array([bos], np.int32)], 1, 0
        spans: list[tuple[int, int]] = [(0, 0)] * len(enc.clues)
        for o in sorted(inserts):
            parts.append(window[prev:o])
            pos += o - prev
            prev = o
            for what, i, seg in inserts[o]:
                if what == "clue" and move_clues:
                    continue
                parts.append(seg)
                if what == "clue":
                    spans[i] = (pos, pos + len(seg))
                pos += len(seg)
        parts.append(window[prev:])
        pos += F - prev
        if move_clues:
            for i, seg in enumerate(enc.clues):
                parts.append(seg)
                spans[i] = (pos, pos + len(seg))
                pos += len(seg)
        q_start = pos
        a_start = q_start + len(enc.question)
        parts += [enc.question, enc.answer, np.array([eos], np.int32)]
        ids = np.concatenate(parts).astype(np.int32)
        assert len(ids) == length, (len(ids), length)
        return ClueExample(
            kind=problem.kind,
            variant="control" if move_clues else "scattered",
            input_ids=ids,
            question_start=q_start,
            answer_start=a_start,
            answer_end=a_start + len(enc.answer),
            clue_spans=tuple(spans),
            n_distractors=len(flat_dist),
            answer=problem.answer.strip(),
        )

    scattered = assemble(move_clues=False)
    assert scattered.distance == expected_distance, (scattered.distance, expected_distance)
    return scattered, assemble(move_clues=True)


_NAME_POOLS: dict[int, tuple[Tokenizer, tuple[str, ...]]] = {}


def single_token_names(tokenizer: Tokenizer) -> tuple[str, ...]:
    """The candidate names (bare letters, then letter-digit names) that `tokenizer` encodes as one
    token after a space, in that order."""
    cached = _NAME_POOLS.get(id(tokenizer))
    if cached is None or cached[0] is not tokenizer:
        encoded = encode_batch(tokenizer, [" " + n for n in _SHORT_NAMES])
        cached = (tokenizer, tuple(n for n, e in zip(_SHORT_NAMES, encoded) if len(e) == 1))
        _NAME_POOLS[id(tokenizer)] = cached  # the tokenizer is kept alive, so its id is not reused
    return cached[1]


def _name_pool(cfg: CluesConfig, tokenizer: Tokenizer) -> tuple[str, ...]:
    if not cfg.single_token_names:
        return _NAMES
    pool = single_token_names(tokenizer)
    if len(pool) < cfg.max_clues + cfg.max_distractors:
        raise ValueError(
            f"single_token_names: the tokenizer writes {len(pool)} names as one token, fewer than "
            f"max_clues + max_distractors = {cfg.max_clues + cfg.max_distractors}; lower max_distractors "
            f"to at most {len(pool) - cfg.max_clues}"
        )
    return pool


def max_distance(enc: "_Encoded", length: int) -> int:
    """The farthest clue 1 can sit from the question in a `length`-token example of this problem:
    right after <|bos|>, everything but itself, the question, the answer and <|eos|> in between."""
    return length - 2 - len(enc.clues[0]) - len(enc.question) - len(enc.answer)


def _bare_tokens(cfg: CluesConfig, kind: str, n_clues: int, tokenizer: Tokenizer) -> int:
    """Tokens of a `kind` problem with `n_clues` clues and nothing else (no distractors or filler)."""
    problem = make_problem(cfg, kind, n_clues, 0, make_rng(cfg.seed, "clues-size", kind, n_clues),
                           _name_pool(cfg, tokenizer))
    return _encode_problem(problem, tokenizer).fixed_tokens


def _num_distractors(cfg: CluesConfig, length: int) -> int:
    n = round(length / 1000 * cfg.distractors_per_1k)
    return int(min(max(n, cfg.min_distractors), cfg.max_distractors))


def make_example(
    cfg: CluesConfig,
    tokenizer: Tokenizer,
    filler: Filler,
    length: int,
    rng: np.random.Generator,
    bucket: tuple[int, int] | None = None,
    kind: str | None = None,
    n_clues: int | None = None,
) -> tuple[ClueExample, ClueExample]:
    """A (scattered, control) pair of `length` tokens; with `bucket`, the distance lies in it.

    Kind and clue count are drawn from `rng` unless given. When the statements, question and answer
    do not fit in `length`, distractors are shed one at a time. Raises ValueError when no draw fits.
    """
    names = _name_pool(cfg, tokenizer)
    for _ in range(_MAX_ATTEMPTS):
        k = kind if kind is not None else cfg.kinds[int(rng.integers(len(cfg.kinds)))]
        n = n_clues if n_clues is not None else int(rng.integers(cfg.min_clues, cfg.max_clues + 1))
        n_d = _num_distractors(cfg, length)
        problem = make_problem(cfg, k, n, n_d, rng, names)
        enc = _encode_problem(problem, tokenizer)
        while enc.fixed_tokens > length and problem.distractors:
            problem = _drop_last_distractor(problem)
            enc = _encode_problem(problem, tokenizer)
        if enc.fixed_tokens > length:
            continue
        if bucket is not None and bucket[0] > max_distance(enc, length):
            # Fail loudly: placing the clues closer than asked would mislabel the eval cell.
            raise ValueError(
                f"could not lay out a clue example of length {length} with distance in {bucket}: "
                f"distance {bucket[0]} needs more room than the {length} tokens give (clue 1 can sit at "
                f"most {max_distance(enc, length)} tokens before the question); use a longer length or "
                "a nearer bucket"
            )
        pair = _layout(problem, enc, tokenizer, filler, length, bucket, rng)
        if pair is not None:
            return pair
    raise ValueError(
        f"could not lay out a clue example of length {length} with distance in {bucket} after "
        f"{_MAX_ATTEMPTS} attempts; use a longer length, fewer clues (max_clues) or a bucket that "
        "starts below the length"
    )


def _drop_last_distractor(problem: Problem) -> Problem:
    chains = list(problem.distractors)
    last = chains.pop()[:-1]
    if last:
        chains.append(last)
    return Problem(problem.kind, problem.clues, tuple(chains), problem.question, problem.answer)


def needs_every_clue(tokenizer: Tokenizer, ex: ClueExample) -> bool:
    """True when the prompt determines the answer and removing any one needed clue undetermines it."""
    prompt = ex.input_ids[: ex.answer_start]
    if solve(decode(tokenizer, prompt)) != ex.answer:
        return False
    for s, e in ex.clue_spans:
        without = np.concatenate([prompt[:s], prompt[e:]])
        if solve(decode(tokenizer, without)) is not None:
            return False
    return True


# ---------------------------------------------------------------------------------------------------
# Tables: training sequences and the held-out eval grid
# ---------------------------------------------------------------------------------------------------


def _common_columns(examples: list[ClueExample]) -> dict[str, pa.Array]:
    return {
        "length": pa.array([e.length for e in examples], pa.int32()),
        "distance": pa.array([e.distance for e in examples], pa.int32()),
        "kind": pa.array([e.kind for e in examples], pa.string()),
        "variant": pa.array([e.variant for e in examples], pa.string()),
        "n_clues": pa.array([len(e.clue_spans) for e in examples], pa.int8()),
        "n_distractors": pa.array([e.n_distractors for e in examples], pa.int16()),
        "clue_starts": pa.array([[s for s, _ in e.clue_spans] for e in examples], pa.list_(pa.int32())),
        "clue_ends": pa.array([[t for _, t in e.clue_spans] for e in examples], pa.list_(pa.int32())),
        "question_start": pa.array([e.question_start for e in examples], pa.int32()),
        "answer": pa.array([e.answer for e in examples], pa.string()),
    }


def clue_training_examples(
    cfg: CluesConfig, length: int, n: int, *, tokenizer: Tokenizer, filler: Filler, stream: int = 0
) -> list[ClueExample]:
    """`n` scattered training examples of `length` tokens; `stream` selects an independent draw."""
    out = []
    for i in range(n):
        scattered, _ = make_example(
            cfg, tokenizer, filler, length, make_rng(cfg.seed, "clues-train", length, stream, i)
        )
        out.append(scattered)
    return out


def clue_training_set(
    cfg: CluesConfig, length: int, n: int, *, tokenizer: Tokenizer, corpus: pa.Table, stream: int = 0
) -> pa.Table:
    """Training table: input_ids (full sequence), answer_start/answer_end, and the example's geometry.

    Filler comes from the corpus's train split. Train with next-token loss on every position, or on
    input_ids[answer_start:answer_end] only.
    """
    filler = build_filler(corpus, tokenizer, "train")
    examples = clue_training_examples(cfg, length, n, tokenizer=tokenizer, filler=filler, stream=stream)
    cols = {
        "input_ids": pa.array([e.input_ids for e in examples], pa.list_(pa.int32())),
        "answer_start": pa.array([e.answer_start for e in examples], pa.int32()),
        "answer_end": pa.array([e.answer_end for e in examples], pa.int32()),
        **_common_columns(examples),
    }
    return with_metadata(
        pa.table(cols),
        {"generator": "clue_training_set", "config": asdict(cfg), "length": length, "n": n,
         "stream": stream},
    )


def eval_cells(cfg: CluesConfig) -> list[tuple[int, int]]:
    """(length, bucket index) cells of the eval grid: every bucket whose lower edge a sequence of that
    length can reach (clue 1, the question, the answer and the two boundary tokens must fit)."""
    # A generous bound on bos + clue 1 + question (4 names) + answer + eos, in tokens.
    reserved = 40
    return [
        (length, b)
        for length in cfg.context_lengths
        for b, (lo, _) in enumerate(distance_buckets(cfg))
        if lo < length - reserved
    ]


def home_cells(cfg: CluesConfig) -> dict[int, int]:
    """{bucket index: length} — each bucket's home cell, the shortest length of `eval_cells` that
    reaches it, where `eval_pairs_per_bucket` puts that bucket's pairs."""
    home: dict[int, int] = {}
    for length, b in eval_cells(cfg):
        home.setdefault(b, length)
    return home


def pairs_in_cell(cfg: CluesConfig, length: int, bucket: int) -> int:
    """(scattered, control) pairs the eval grid holds in one cell: `eval_per_cell`, or the bucket's
    `eval_pairs_per_bucket` count in its home cell when that is more."""
    if cfg.eval_pairs_per_bucket and home_cells(cfg).get(bucket) == length:
        return max(cfg.eval_per_cell, cfg.eval_pairs_per_bucket[bucket])
    return cfg.eval_per_cell


def _eval_examples(cfg, length, bucket, tokenizer, filler) -> list[ClueExample]:
    buckets = distance_buckets(cfg)
    if not 0 <= bucket < len(buckets):
        raise ValueError(f"distance_bucket must be in [0, {len(buckets)}), got {bucket}")
    out = []
    # Pair i of a cell is the same example whatever the cell's size: its rng is keyed by i.
    for i in range(pairs_in_cell(cfg, length, bucket)):
        # Kinds and clue counts cycle so every cell has the same mix, over the counts whose
        # statements, question and answer fit the length at all (4-clue recall needs 65+ tokens).
        kind = cfg.kinds[i % len(cfg.kinds)]
        counts = [n for n in range(cfg.min_clues, cfg.max_clues + 1)
                  if _bare_tokens(cfg, kind, n, tokenizer) <= length] or [cfg.min_clues]
        n_clues = counts[(i // len(cfg.kinds)) % len(counts)]
        r = make_rng(cfg.seed, "clues-eval", length, bucket, i)
        out.extend(make_example(cfg, tokenizer, filler, length, r, buckets[bucket], kind, n_clues))
    return out


def _eval_table(cfg: CluesConfig, cells: list[tuple[int, int, list[ClueExample]]]) -> pa.Table:
    examples = [e for _, _, exs in cells for e in exs]
    buckets = distance_buckets(cfg)
    cell_of = [(length, b) for length, b, exs in cells for _ in exs]
    cols = {
        "length_target": pa.array([c[0] for c in cell_of], pa.int32()),
        "bucket": pa.array([c[1] for c in cell_of], pa.int32()),
        "bucket_lo": pa.array([buckets[c[1]][0] for c in cell_of], pa.int32()),
        "bucket_hi": pa.array([buckets[c[1]][1] for c in cell_of], pa.int32()),
        # Rows come in (scattered, control) twins sharing a pair_id.
        "pair_id": pa.array([i // 2 for i in range(len(examples))], pa.int32()),
        "prompt_ids": pa.array([e.input_ids[: e.answer_start] for e in examples], pa.list_(pa.int32())),
        # The answer's tokens and the <|eos|> after them: "4" must not score as a prefix of "42".
        "answer_ids": pa.array(
            [e.input_ids[e.answer_start : e.answer_end + 1] for e in examples], pa.list_(pa.int32())
        ),
        **_common_columns(examples),
    }
    return with_metadata(pa.table(cols), {"generator": "clue_eval", "config": asdict(cfg)})


def clue_eval_set(
    cfg: CluesConfig,
    length: int,
    distance_bucket: int,
    *,
    tokenizer: Tokenizer,
    corpus: pa.Table | None = None,
    filler: Filler | None = None,
) -> pa.Table:
    """Held-out eval examples of one (length, distance bucket) cell, each with its control twin.

    Columns: prompt_ids (everything up to and including "Answer:"), answer_ids (the answer's tokens
    then <|eos|>, scored by greedy decoding of len(answer_ids) tokens or by their summed
    log-probability; prompt_ids + answer_ids is the whole `length`-token sequence), answer
    (text), variant ("scattered" | "control"), pair_id, distance, bucket, kind, n_clues, ... Filler
    comes from the corpus's held-out split; pass `filler` to reuse one built by `build_filler`.
    """
    if filler is None:
        if corpus is None:
            raise ValueError("pass corpus= (the corpus table) or filler= (from build_filler)")
        filler = build_filler(corpus, tokenizer, "heldout")
    examples = _eval_examples(cfg, length, distance_bucket, tokenizer, filler)
    return _eval_table(cfg, [(length, distance_bucket, examples)])


def clue_eval_grid(cfg: CluesConfig, *, tokenizer: Tokenizer, corpus: pa.Table) -> pa.Table:
    """Every cell of `eval_cells(cfg)` in one table (see `clue_eval_set` for the columns)."""
    filler = build_filler(corpus, tokenizer, "heldout")
    cells = [
        (length, b, _eval_examples(cfg, length, b, tokenizer, filler))
        for length, b in eval_cells(cfg)
    ]
    return _eval_table(cfg, cells)

