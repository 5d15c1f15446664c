"""`k3 params`: parameter accounting on the meta device, checked against K3's published figures."""

import pytest

from k3model.config import get_profile
from k3model.model import K3Model
from k3model.params import count_params


def test_k3_preset_lands_within_three_percent_of_published_counts():
    counts = count_params("k3")
    assert abs(counts["total"] / 2.8e12 - 1) < 0.03
    assert abs(counts["active"] / 104e9 - 1) < 0.03
    assert counts["layers"] == {"n_layers": 93, "kda": 69, "mla": 24, "dense": 1}
    # The routed experts dominate the total but not the active count.
    assert counts["moe"]["routed"] / counts["total"] > 0.95
    assert counts["moe"]["routed_active"] / counts["active"] < 0.5


def test_meta_counts_equal_a_real_instantiation():
    counts = count_params("smoke")
    model = K3Model(get_profile("smoke").model)
    assert counts["total_with_mtp"] == sum(p.numel() for p in model.parameters())


def test_unknown_profile_is_a_value_error():
    with pytest.raises(ValueError, match="choose one of"):
        count_params("k4")
