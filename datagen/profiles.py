"""Per-profile data sizes: `presets(profile)` → DatagenConfig, one small function per profile.

Profiles (DESIGN §3): `smoke` (the test suite, whole graph in about a minute), `tiny` (default, a 2-core
CPU) and `small` (one GPU). tiny (64 → 512 → 2K → 8K) and small (512 → 4K → 16K → 64K) keep K3's
8K : 64K : 256K : 1M = 1 : 8 : 32 : 128 context-stage ratios; smoke uses 64 → 128 → 256 → 512 to stay
fast. Distance buckets are cut so that bucket i+1
first becomes reachable at stage i+1's length: claim 1 asks whether later stages answer at distances
where earlier ones fail. `k3` is the published shape, used only for parameter accounting: it has no
data preset.

Image tokens per image follow the vision encoder: patch 8 and a 2×2 merge, so 32 px → 4 tokens and
64 px → 16 tokens (datagen.images.image_token_count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from datagen.clues import CluesConfig
from datagen.corpus import CorpusConfig
from datagen.images import PALETTE, ImagesConfig, image_token_count
from datagen.packing import PackingConfig
from datagen.tokenizer import TokenizerConfig

VISION_PATCH_SIZE = 8


@dataclass(frozen=True)
class DatagenConfig:
    profile: str
    tokenizer: TokenizerConfig
    corpus: CorpusConfig
    clues: CluesConfig
    images: ImagesConfig
    packing: PackingConfig
    # Pretraining tokens per context stage; a stage of length L gets tokens_per_stage // L rows.
    tokens_per_stage: int

    def __post_init__(self):
        if self.tokens_per_stage < max(self.context_lengths):
            raise ValueError(
                f"tokens_per_stage={self.tokens_per_stage} is below the longest context "
                f"{max(self.context_lengths)}: every stage needs at least one row"
            )

    @property
    def context_lengths(self) -> tuple[int, ...]:
        return self.clues.context_lengths

    def sequences_per_stage(self) -> tuple[int, ...]:
        return tuple(self.tokens_per_stage // length for length in self.context_lengths)

    def to_dict(self) -> dict:
        return asdict(self)


def _smoke(seed: int) -> DatagenConfig:
    return DatagenConfig(
        profile="smoke",
        tokenizer=TokenizerConfig(vocab_size=512, train_chars=300_000),
        corpus=CorpusConfig(seed=seed, stdlib_chars=250_000, prose_docs=150, heldout_fraction=0.1,
                            max_doc_chars=8000),
        clues=CluesConfig(
            seed=seed,
            context_lengths=(64, 128, 256, 512),
            distance_edges=(0, 32, 64, 128, 256, 512),
            max_clues=3,
            distractors_per_1k=8.0,
            min_distractors=1,
            max_distractors=8,
            eval_per_cell=4,
        ),
        images=ImagesConfig(seed=seed, image_size=32, n_images=200, heldout_fraction=0.2,
                            questions_per_image=2),
        packing=PackingConfig(seed=seed, image_tokens=image_token_count(32, VISION_PATCH_SIZE)),
        tokens_per_stage=8192,
    )


def _tiny(seed: int) -> DatagenConfig:
    return DatagenConfig(
        profile="tiny",
        tokenizer=TokenizerConfig(vocab_size=4096, train_chars=4_000_000),
        corpus=CorpusConfig(seed=seed, stdlib_chars=6_000_000, prose_docs=2000),
        clues=CluesConfig(
            seed=seed,
            context_lengths=(64, 512, 2048, 8192),
            distance_edges=(0, 32, 256, 1024, 4096, 8192),
            # What a 2–3M-parameter model can learn (issue 17): multi-key recall of 2–4 one-token
            # names and one-digit values; chains and sums stayed at chance even with the clues next
            # to the question. 25 one-token names cap the distractors at 20.
            kinds=("recall",),
            single_token_names=True,
            value_max=9,
            # `B=5.`: name, "=" and value in three adjacent tokens (`B = 5.` is five, with a lone
            # space before the digit), inside the KDA layers' 4-token short convolution.
            compact_statements=True,
            max_distractors=20,
            # Claim 1 compares (stage, bucket, variant) cells by 95 % Wilson intervals: 384 pairs give
            # ±0.05 at worst (p = 0.5), 96 give ±0.1. Each bucket's pairs sit in its home cell (its
            # shortest length); one pair in every other cell. 8192-token rows cost ~1.3 s each on the
            # 2-core CPU, so the farthest bucket gets 32 pairs (±0.17; 0 of 32 reads [0, 0.11]).
            # The four stages' evaluations cost ~2 min each (docs/log/claim1.md).
            eval_per_cell=1,
            eval_pairs_per_bucket=(384, 96, 96, 96, 32),
        ),
        images=ImagesConfig(seed=seed, image_size=32, n_images=4000),
        packing=PackingConfig(seed=seed, image_tokens=image_token_count(32, VISION_PATCH_SIZE)),
        tokens_per_stage=1 << 19,
    )


def _small(seed: int) -> DatagenConfig:
    return DatagenConfig(
        profile="small",
        tokenizer=TokenizerConfig(vocab_size=16384, train_chars=20_000_000),
        # More than the standard library holds: every usable file is read.
        corpus=CorpusConfig(seed=seed, stdlib_chars=100_000_000, prose_docs=10_000),
        clues=CluesConfig(
            seed=seed,
            context_lengths=(512, 4096, 16384, 65536),
            distance_edges=(0, 256, 2048, 8192, 32768, 65536),
            distractors_per_1k=2.0,
            max_distractors=64,
            eval_per_cell=32,
        ),
        images=ImagesConfig(
            seed=seed, image_size=64, grid=3, max_objects=6, colors=tuple(PALETTE), n_images=20_000
        ),
        packing=PackingConfig(seed=seed, image_tokens=image_token_count(64, VISION_PATCH_SIZE)),
        tokens_per_stage=1 << 24,
    )


_PRESETS: dict[str, Callable[[int], DatagenConfig]] = {"smoke": _smoke, "tiny": _tiny, "small": _small}
PROFILES = tuple(_PRESETS)


def presets(profile: str = "tiny", seed: int = 0) -> DatagenConfig:
    """The data configuration of a profile; `seed` seeds every generator."""
    if profile not in _PRESETS:
        raise ValueError(f"unknown profile {profile!r}; valid profiles: {', '.join(PROFILES)}")
    return _PRESETS[profile](seed)
