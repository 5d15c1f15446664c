"""datagen.profiles: presets per profile, context-stage ratios, errors for unknown profiles."""

import pytest

from datagen.images import image_token_count
from datagen.profiles import PROFILES, VISION_PATCH_SIZE, presets


def test_unknown_profile_names_the_choices():
    with pytest.raises(ValueError) as e:
        presets("k3")
    for name in ("smoke", "tiny", "small"):
        assert name in str(e.value)


@pytest.mark.parametrize("profile", PROFILES)
def test_stage_ratios_and_derived_sizes(profile):
    cfg = presets(profile)
    lengths = cfg.context_lengths
    # K3's 8K:64K:256K:1M; smoke trades the ratios for a suite that runs in about a minute.
    if profile == "smoke":
        assert lengths == (64, 128, 256, 512)
    else:
        assert [n // lengths[0] for n in lengths] == [1, 8, 32, 128]
    assert all(n * length <= cfg.tokens_per_stage for n, length in zip(cfg.sequences_per_stage(), lengths))
    assert cfg.packing.image_tokens == image_token_count(cfg.images.image_size, VISION_PATCH_SIZE)
    # The last distance bucket reaches the longest stage and the first stage reaches two buckets.
    assert cfg.clues.distance_edges[-1] == lengths[-1]
    assert cfg.clues.distance_edges[1] < lengths[0]


def test_default_is_tiny_with_small_vocab():
    cfg = presets()
    assert cfg.profile == "tiny"
    assert cfg.context_lengths == (64, 512, 2048, 8192)
    assert 2048 <= cfg.tokenizer.vocab_size <= 4096
    assert presets("smoke").tokenizer.vocab_size == 512


def test_seed_reaches_every_generator():
    cfg = presets("smoke", seed=7)
    assert cfg.corpus.seed == cfg.clues.seed == cfg.images.seed == cfg.packing.seed == 7


def test_image_token_count():
    assert image_token_count(32, 8) == 4
    assert image_token_count(64, 8) == 16
    with pytest.raises(ValueError, match="multiple"):
        image_token_count(40, 8)
