"""The effort vocabulary's pure parts: scaled episode budgets (a quick run's shorter episodes)."""

import pytest

from k3model.train.effort import EFFORT_SPECS, effort_specs, scaled_budgets
from k3model.train.recipes import POSTTRAIN_SIZES, eval_plan


def test_scaled_budgets_on_hand_computed_values():
    tiny = (("low", 256, 128), ("high", 512, 192), ("max", 1024, 256))
    assert scaled_budgets(tiny, 1.0) == tiny
    assert scaled_budgets(None, 1.0) is None  # the defaults stay the defaults
    assert scaled_budgets(tiny, 0.125) == (("low", 32, 16), ("high", 64, 24), ("max", 128, 32))
    # None scales EFFORT_SPECS' own budgets; the order low < high < max survives, nothing reaches 0.
    assert scaled_budgets(None, 0.25) == (("low", 256, 64), ("high", 512, 96), ("max", 1024, 128))
    assert scaled_budgets((("low", 3, 1),), 0.1) == (("low", 1, 1),)
    specs = effort_specs(scaled_budgets(None, 0.5))
    assert specs["max"].budget_tokens == EFFORT_SPECS["max"].budget_tokens // 2
    assert specs["low"].length_coef == EFFORT_SPECS["low"].length_coef


@pytest.mark.parametrize("scale", [0.0, -0.5, 1.5])
def test_a_scale_outside_0_1_is_refused(scale):
    with pytest.raises(ValueError, match=f"budget scale {scale} is not in"):
        scaled_budgets(None, scale)


def test_eval_plan_carries_the_scale():
    assert eval_plan("tiny").budgets == POSTTRAIN_SIZES["tiny"].eval_budgets
    assert eval_plan("small", budget_scale=0.125).specs()["max"].budget_tokens == 512
