"""Cross-harness transfer: the ratio interval by hand and the folds' harnesses."""

import math

import pytest

from k3model.train.transfer import fold_harnesses, ratio_interval


def test_ratio_interval_by_hand():
    # 4/10 held out vs 8/10 in harness: ratio 0.5, var = 1/4 − 1/10 + 1/8 − 1/10 = 0.175,
    # log 0.5 ± 1.96·√0.175 = −0.6931 ± 0.8199.
    ratio, lo, hi = ratio_interval(4, 10, 8, 10)
    assert ratio == pytest.approx(0.5)
    assert lo == pytest.approx(math.exp(-0.693147 - 0.819918), rel=1e-4)
    assert hi == pytest.approx(math.exp(-0.693147 + 0.819918), rel=1e-4)
    # Zero held-out successes: 0.5 is added to that count and its n; the ratio itself is 0.
    ratio, lo, hi = ratio_interval(0, 10, 5, 10)
    assert ratio == 0.0 and 0 < lo < 0.1 < hi
    assert hi == pytest.approx(math.exp(math.log((0.5 / 10.5) / 0.5)
                                        + 1.959964 * math.sqrt(1 / 0.5 - 1 / 10.5 + 1 / 5 - 1 / 10)), rel=1e-5)
    # No in-harness success: undefined.
    assert ratio_interval(3, 10, 0, 10) == (None, 0.0, math.inf)
    with pytest.raises(ValueError):
        ratio_interval(11, 10, 1, 10)


def test_fold_harnesses():
    train, single = fold_harnesses("openclaw")
    assert "openclaw" not in train and len(train) == 4 and single == train[0]
    # Another held-out style: the main lineage's reserved one is never trained on either.
    train, single = fold_harnesses("codex", "hermes")
    assert single == "hermes" and set(train) == {"kimi_code", "claude_code", "hermes"}
    with pytest.raises(ValueError, match="one of the fold's harnesses"):
        fold_harnesses("codex", "codex")
