"""k3model.train.stats against textbook and hand-computed values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from k3model.train import stats as S


def test_wilson_matches_newcombe_1998_table_i():
    # Newcombe (1998a), Table I, method 3 (score): 81/263 → 0.2553–0.3662; 15/148 → 0.0624–0.1605.
    assert S.wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    assert S.wilson(15, 148) == pytest.approx((0.0624, 0.1605), abs=5e-5)
    lo, hi = S.wilson(0, 3)  # 0 of n: upper z²/(n + z²)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(S.Z95 ** 2 / (3 + S.Z95 ** 2))
    assert S.wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes ≤ n"):
        S.wilson(4, 3)


def test_newcombe_matches_newcombe_1998_table_ii():
    # Newcombe (1998a), Table II example (a): 56/70 − 48/80 = 0.2000, method 10: 0.0524 to 0.3339.
    d, lo, hi = S.newcombe(56, 70, 48, 80)
    assert d == pytest.approx(0.2) and (lo, hi) == pytest.approx((0.0524, 0.3339), abs=5e-5)


def test_katz_ratio_by_hand():
    # 20/100 over 40/100: log 0.5 ± 1.96·√(1/20 − 1/100 + 1/40 − 1/100) = log 0.5 ± 1.96·√0.055.
    r, lo, hi = S.katz_ratio(20, 100, 40, 100)
    half = S.Z95 * math.sqrt(0.055)
    assert r == pytest.approx(0.5) and (lo, hi) == pytest.approx((0.5 * math.exp(-half), 0.5 * math.exp(half)))
    assert S.katz_ratio(3, 10, 0, 10) == (None, 0.0, math.inf)


def test_mcnemar_exact_by_hand():
    # b = 8, c = 2: P(B ≥ 8 | 10, ½) = (45 + 10 + 1) / 1024, doubled.
    assert S.mcnemar_exact(8, 2) == pytest.approx(2 * 56 / 1024)
    assert S.mcnemar_exact(2, 8) == pytest.approx(2 * 56 / 1024)
    assert S.mcnemar_exact(5, 5) == 1.0 and S.mcnemar_exact(0, 0) == 1.0
    assert S.mcnemar_exact(6, 0) == pytest.approx(2 / 64)
    with pytest.raises(ValueError):
        S.mcnemar_exact(-1, 2)


def test_paired_difference_matches_agresti():
    # Agresti, "Categorical Data Analysis", presidential approval (n = 1600; b = 150, c = 86):
    # d = 0.04, 95 % interval (0.021, 0.059); Agresti–Min's ½ per cell moves it by < 1e-3.
    d, lo, hi = S.paired_difference(150, 86, 1600)
    assert d == pytest.approx(0.04) and (round(lo, 3), round(hi, 3)) == (0.021, 0.059)
    # By hand at b = 8, c = 2, n = 20: b* 8.5, c* 2.5, n* 22; d* = 6/22, half = z·√(11 − 36/22)/22.
    d, lo, hi = S.paired_difference(8, 2, 20)
    half = S.Z95 * math.sqrt(11 - 36 / 22) / 22
    assert d == pytest.approx(0.3) and (lo, hi) == pytest.approx((6 / 22 - half, 6 / 22 + half))
    with pytest.raises(ValueError, match="b \\+ c ≤ n"):
        S.paired_difference(8, 5, 10)


def test_paired_counts():
    new = {"a": 1, "b": 1, "c": 0, "d": 0}
    base = {"a": 1, "b": 0, "c": 1, "d": 0}
    assert S.paired_counts(new, base) == (1, 1, 4)
    with pytest.raises(ValueError, match="same tasks"):
        S.paired_counts(new, {"a": 1})
    with pytest.raises(ValueError, match="0 or 1"):
        S.paired_counts({"a": 2}, {"a": 1})


def test_holm_textbook():
    # p = (0.01, 0.04, 0.03, 0.005): sorted 0.005·4, 0.01·3, 0.03·2, 0.04·1 → 0.02, 0.03, 0.06, max(0.06, 0.04).
    adjusted, rejected = S.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02]) and rejected == [True, False, False, True]
    assert S.holm([0.5, 0.9], alpha=0.05)[0] == [1.0, 1.0]


def test_connor_power_and_n_by_hand():
    # p0 0.30, δ 0.15 → p1 0.45; independence ψ = 0.45·0.70 + 0.30·0.55 = 0.48.
    psi = 0.48
    z = (0.15 * 16 - S.Z95 * math.sqrt(psi)) / math.sqrt(psi - 0.0225)
    assert S.connor_power(0.3, 0.15, 256) == pytest.approx(0.5 * (1 + math.erf(z / math.sqrt(2))))
    need = (S.Z95 * math.sqrt(psi) + 0.8416212335729143 * math.sqrt(psi - 0.0225)) ** 2 / 0.0225
    assert S.connor_n(0.3, 0.15) == math.ceil(need) == 166
    assert S.discordance(0.3, 0.15, psi=0.2) == pytest.approx((0.175, 0.025))
    with pytest.raises(ValueError, match="discordance"):
        S.discordance(0.3, 0.15, psi=0.1)


def _brute_newcombe_power(p0, effect, n1, n2):
    """Every (s₁, s₂), each judged with the module's own `newcombe` interval on the side of the effect."""
    p1 = p0 + effect
    total = 0.0
    for s1, s2 in itertools.product(range(n1 + 1), range(n2 + 1)):
        _, lo, hi = S.newcombe(s1, n1, s2, n2)
        prob = (math.comb(n1, s1) * p1 ** s1 * (1 - p1) ** (n1 - s1)
                * math.comb(n2, s2) * p0 ** s2 * (1 - p0) ** (n2 - s2))
        total += prob * (lo > 0 if effect > 0 else hi < 0)
    return total


def test_newcombe_power_is_the_exact_sum_of_the_newcombe_rule():
    # Both directions by brute force; the reported power is the smaller.
    up, down = _brute_newcombe_power(0.4, 0.2, 30, 25), _brute_newcombe_power(0.4, -0.2, 30, 25)
    assert up != pytest.approx(down, abs=1e-3)
    assert S.newcombe_power(0.4, 0.2, 30, 25) == pytest.approx(min(up, down), abs=1e-12)
    # Near the ceiling only the downward direction exists.
    assert S.newcombe_power(0.9, 0.15, 20, 20) == pytest.approx(_brute_newcombe_power(0.9, -0.15, 20, 20), abs=1e-12)


def test_newcombe_power_is_near_the_normal_approximation_and_grows_with_n_and_effect():
    # p0 0.40, δ 0.05, 2000 episodes an arm, upward (the smaller direction): SE = √(0.45·0.55/2000 + 0.4·0.6/2000)
    # = 0.01561, Φ(0.05/0.01561 − 1.96) = Φ(1.243) = 0.893.
    assert S.newcombe_power(0.4, 0.05, 2000, 2000) == pytest.approx(0.893, abs=0.01)
    powers = [S.newcombe_power(0.4, 0.05, n, n) for n in (100, 500, 2000, 8000)]
    assert powers == sorted(powers) and powers[0] < 0.2 and powers[-1] > 0.999
    assert S.newcombe_power(0.4, 0.02, 2000, 2000) < S.newcombe_power(0.4, 0.05, 2000, 2000)
    # No true difference: the chance of a verdict on one given side, α/2.
    assert S.newcombe_power(0.4, 1e-9, 2000, 2000) == pytest.approx(0.025, abs=0.003)


@pytest.mark.parametrize("args, match", [((0.4, 0.05, 0, 10), "n1=0"), ((0.4, 0.05, 10, 0), "n2=0"),
                                         ((1.2, 0.05, 10, 10), "1.2"), ((-0.1, 0.05, 10, 10), "-0.1"),
                                         ((0.4, 0.0, 10, 10), "got 0.0"), ((0.4, -0.05, 10, 10), "-0.05"),
                                         ((0.5, 0.6, 10, 10), "smaller effect")])
def test_newcombe_power_refuses_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        S.newcombe_power(*args)


def _brute_power(p0, effect, n, min_gain, alpha):
    """Every (b, c) of n tasks, each judged with the module's own test and interval."""
    pb, pc = S.discordance(p0, effect)
    pe = 1 - pb - pc
    total = 0.0
    for b, c in itertools.product(range(n + 1), repeat=2):
        if b + c > n:
            continue
        prob = math.factorial(n) / (math.factorial(b) * math.factorial(c) * math.factorial(n - b - c)) \
            * pb ** b * pc ** c * pe ** (n - b - c)
        passes = (b > c and S.mcnemar_exact(b, c) <= alpha and (b - c) >= min_gain * n - 1e-9
                  and S.paired_difference(b, c, n)[1] > 0)
        total += prob * passes
    return total


@pytest.mark.parametrize("p0, effect, n, min_gain, alpha", [(0.3, 0.3, 12, 0.0, 0.05), (0.2, 0.4, 15, 0.1, 0.05 / 9),
                                                            (0.5, 0.2, 20, 0.1, 0.05)])
def test_exact_paired_power_equals_brute_force(p0, effect, n, min_gain, alpha):
    assert S.paired_power(p0, effect, n, min_gain=min_gain, alpha=alpha) == pytest.approx(
        _brute_power(p0, effect, n, min_gain, alpha), abs=1e-12)


def test_exact_power_is_near_connor_and_min_n_is_the_first_that_reaches_the_target():
    assert S.paired_power(0.3, 0.15, 256) == pytest.approx(S.connor_power(0.3, 0.15, 256), abs=0.02)
    assert S.paired_power(0.3, 0.0, 200) <= 0.05  # no gain: at most the test's level
    n = S.min_paired_n(0.3, 0.15, min_gain=0.10, alpha=0.05 / 9)
    assert S.paired_power(0.3, 0.15, n, min_gain=0.10, alpha=0.05 / 9) >= 0.8
    assert S.paired_power(0.3, 0.15, n - 1, min_gain=0.10, alpha=0.05 / 9) < 0.8
    with pytest.raises(ValueError, match="cannot pass"):
        S.min_paired_n(0.3, 0.05, min_gain=0.10)


def test_retention_by_hand():
    # One cell, n 100: student 0.5, teacher 0.5, SFT 0.3 → U = V = 20, R = 1;
    # Var(U) = Var(V) = 100·(0.25 + 0.21) = 46, Cov = 21: Var(U − V) = 46 − 42 + 46 = 50.
    r, lo, hi = S.retention_from_counts([(0.5, 0.5, 0.3, 100)])
    assert r == pytest.approx(1.0) and (lo, hi) == pytest.approx((1 - S.Z95 * math.sqrt(50) / 20,
                                                                 1 + S.Z95 * math.sqrt(50) / 20))
    assert S.retention_from_counts([(0.5, 0.3, 0.3, 100)])[0] is None  # the teacher gained nothing
    # Paired, 4 tasks: u = (1, 0, 0, 0), v = (1, 0, 1, 0), R = 1/2, z = (½, 0, −½, 0), var 1/6;
    # Var(R) = 4 · (1/6) / 2² = 1/6.
    r, lo, hi = S.retention_from_outcomes([[1, 1, 0, 0]], [[1, 1, 1, 0]], [[0, 1, 0, 0]])
    assert r == 0.5 and hi - r == pytest.approx(S.Z95 * math.sqrt(1 / 6))


def test_gain_ratio_by_hand():
    # Held out (0.4, 0.2), in-harness (0.6, 0.3), n 100 each: R = 0.2/0.3;
    # Var = (0.0024 + 0.0016 + R²·(0.0024 + 0.0021)) / 0.09.
    r, lo, hi = S.gain_ratio((0.4, 0.2), (100, 100), (0.6, 0.3), (100, 100))
    var = (0.0024 + 0.0016 + (2 / 3) ** 2 * 0.0045) / 0.09
    assert r == pytest.approx(2 / 3) and hi - r == pytest.approx(S.Z95 * math.sqrt(var))
    assert S.gain_ratio((0.4, 0.2), (100, 100), (0.3, 0.3), (100, 100))[0] is None


def test_ratio_power_grows_with_n():
    # An identical student (the audit's case: 8 tasks per cell almost never passes).
    small = S.retention_power([(0.45, 0.3, 8)] * 9, sims=500)
    large = S.retention_power([(0.45, 0.3, 512)] * 9, sims=500)
    assert small < 0.05 and large > 0.9
    assert S.gain_ratio_power((0.3, 0.3), (1024, 1024), (0.6, 0.3), (1024, 1024), sims=500) > 0.7
    assert S.gain_ratio_power((0.3, 0.3), (8, 8), (0.6, 0.3), (8, 8), sims=500) < 0.7


def test_paired_retention_power_grows_with_tasks_and_falls_with_what_is_kept():
    # A teacher that gains 4 of 8 samples on half the tasks over sft_policy's 2 of 8 everywhere.
    def cell(n):
        return [6 if i % 2 else 2 for i in range(n)], [2] * n
    few, many = [cell(8)], [cell(256)]
    keep_all = S.retention_power_paired([c[0] for c in many], [c[1] for c in many], 8, sims=300)
    keep_half = S.retention_power_paired([c[0] for c in many], [c[1] for c in many], 8, retained=0.5, sims=300)
    tiny = S.retention_power_paired([c[0] for c in few], [c[1] for c in few], 8, sims=300)
    assert keep_all > 0.9 and keep_half < 0.05 and tiny < keep_all
    with pytest.raises(ValueError, match="same, non-zero number of cells"):
        S.retention_power_paired([], [], 8)


def test_transfer_power_paired_needs_tasks_and_falls_when_little_transfers():
    held, inside = [3, 1] * 128, [2, 4] * 128
    full = S.transfer_power_paired(held, inside, 8, 0.15, sims=300)
    half = S.transfer_power_paired(held, inside, 8, 0.15, transfer=0.5, sims=300)
    few = S.transfer_power_paired(held[:8], inside[:8], 8, 0.15, sims=300)
    assert full > 0.8 and half < 0.1 and few < full
    # R = 1, u − v = (−½, ½, 0): Var(R) = 3 · ¼ / 1².
    r, lo, hi = S.paired_gain_ratio([([0.5, 0.5, 0.0], [1.0, 0.0, 0.0])])
    assert r == 1.0 and (lo, hi) == pytest.approx((1 - S.Z95 * math.sqrt(0.75), 1 + S.Z95 * math.sqrt(0.75)))


def test_require_paired_n_refuses_with_the_numbers():
    with pytest.raises(ValueError, match=r"n = 64 per cell gives power 0\.\d\d < 0\.80; n ≥ \d+ per cell reaches it"):
        S.require_paired_n(64, 0.3, 0.15, min_gain=0.10, alpha=0.05 / 9, what="claim 3")
    assert S.require_paired_n(400, 0.3, 0.15, min_gain=0.10, alpha=0.05 / 9) >= 0.8


def test_pass_at_k_is_chens_estimator_by_hand():
    # n = 8, c = 3: pass@1 = 3/8; pass@2 = 1 − C(5,2)/C(8,2) = 1 − 10/28; pass@8 = 1 when c > 0.
    assert S.pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert S.pass_at_k(8, 3, 2) == pytest.approx(1 - 10 / 28)
    assert S.pass_at_k(8, 1, 8) == 1.0 and S.pass_at_k(8, 0, 8) == 0.0
    with pytest.raises(ValueError, match="1 ≤ k ≤ n"):
        S.pass_at_k(4, 1, 8)


def test_paired_bootstrap_brackets_the_mean_and_matches_the_normal_interval():
    import numpy as np
    rng = np.random.default_rng(3)
    base = rng.binomial(8, 0.4, 400) / 8
    new = np.clip(base + rng.normal(0.05, 0.2, 400), 0, 1)
    d, lo, hi, p = S.paired_bootstrap(new, base, resamples=20_000)
    diff = new - base
    assert d == pytest.approx(diff.mean())
    # For n = 400 the percentile interval is the normal one d̄ ± z·sd/√n to within a few 1e-3.
    half = S.Z95 * diff.std(ddof=1) / math.sqrt(diff.size)
    assert (lo, hi) == pytest.approx((d - half, d + half), abs=3e-3)
    assert p < 0.05 and lo > 0
    # Identical policies: the gain is 0 and the interval straddles it (no task differs: p = 1).
    d0, lo0, hi0, p0 = S.paired_bootstrap(base, base)
    assert (d0, lo0, hi0, p0) == (0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="same tasks"):
        S.paired_bootstrap(new[:10], base[:9])


def test_paired_mean_power_grows_with_n_and_respects_the_minimum_gain():
    import numpy as np
    rng = np.random.default_rng(0)
    small, large = rng.binomial(8, 0.45, 32), rng.binomial(8, 0.45, 256)
    p_small = S.paired_mean_power(small, 8, 0.10, sims=200, resamples=500)
    p_large = S.paired_mean_power(large, 8, 0.10, sims=200, resamples=500)
    assert p_small < p_large and p_large > 0.95
    # A rule that needs a gain ≥ the true gain + 10 points almost never passes.
    assert S.paired_mean_power(large, 8, 0.05, min_gain=0.15, sims=100, resamples=200) < 0.05
    with pytest.raises(ValueError, match="effect must lie"):
        S.paired_mean_power(large, 8, 0.9)


def test_se_power_by_hand_and_against_the_bootstrap_model():
    import numpy as np
    # SE 0.02, δ 0.05: Φ(2.5 − 1.96) = Φ(0.54) = 0.7054; at δ → 0 it is α/2.
    assert S.se_power(0.05, 0.02) == pytest.approx(0.7054, abs=1e-4)
    assert S.se_power(1e-12, 0.02) == pytest.approx(0.025)
    assert S.se_power(0.05, 0.01) > S.se_power(0.05, 0.02) < S.se_power(0.08, 0.02)
    # Where each task's difference is only the two arms' binomial noise, the SE of that noise gives what
    # the simulated paired_mean_power gives: 256 tasks near 40 %, k 8, at the simulation's plug-in
    # rates pᵢ = rᵢ/8, SE² = 2·mean(pᵢ(1 − pᵢ))/8/256 (≈ 0.556 by hand; the simulation 0.57).
    rng = np.random.default_rng(5)
    base = rng.binomial(8, 0.4, size=256)
    p = base / 8
    se = (2 * (p * (1 - p)).mean() / 8 / 256) ** 0.5
    assert S.se_power(0.03, se) == pytest.approx(S.paired_mean_power(base, 8, 0.03, sims=400, resamples=500), abs=0.05)
    for bad, match in (((0.0, 0.02), "effect"), ((0.05, -1.0), "standard error")):
        with pytest.raises(ValueError, match=match):
            S.se_power(*bad)


def test_noninferiority_power_grows_with_n_and_the_margin():
    rng = __import__("numpy").random.default_rng(3)
    base = rng.binomial(8, 0.4, size=256)
    wide, narrow, few = (S.noninferiority_power(b, 8, m, sims=200, resamples=500)
                         for b, m in ((base, 0.05), (base, 0.01), (base[:16], 0.05)))
    assert wide > 0.8 and narrow < 0.5 and few < 0.5
    with pytest.raises(ValueError, match="margin"):
        S.noninferiority_power(base, 8, 0.0)


def test_compare_not_worse_reads_the_lower_bound_against_the_margin():
    from k3model.train.paired_eval import compare_not_worse
    base = [4, 4, 4, 4] * 16
    arm = lambda per_task: {"sampled": {"per_task": per_task}, "greedy": {"per_task": [1] * len(per_task)}}
    same = compare_not_worse(arm(base), arm(base), 8, 0.05, powered=True)["pass1"]
    assert same["difference"] == 0 and same["verdict"] == "pass"
    worse = compare_not_worse(arm([3, 3, 3, 3] * 16), arm(base), 8, 0.05, powered=True)["pass1"]  # −12.5 points
    assert worse["hi"] < -0.05 and worse["verdict"] == "fail"
    assert compare_not_worse(arm(base), arm(base), 8, 0.05, powered=False)["pass1"]["verdict"] == "underpowered"


def test_the_difference_of_two_transfer_ratios_by_bootstrap():
    rng = np.random.default_rng(1)
    v = rng.binomial(8, 0.5, 256) / 8 - rng.binomial(8, 0.3, 256) / 8  # in-harness gains, +0.2 on average
    noise, other = rng.normal(0, 0.05, 256), rng.normal(0, 0.05, 256)
    full, none = (v + noise, v), (other, v)  # transfers all of its gain / none of it
    d, lo, hi, undefined = S.paired_ratio_difference(full, none, resamples=2000)
    assert d == pytest.approx((v + noise).sum() / v.sum() - other.sum() / v.sum())
    assert undefined == 0 and 0 < lo < d < hi and lo > 0.7
    d, lo, hi, _ = S.paired_ratio_difference(full, full, resamples=2000)
    assert d == 0 and lo == hi == 0  # the same arm twice: every resample's difference is 0
    d, lo, hi, _ = S.paired_ratio_difference(full, (noise, -v), resamples=2000)
    assert d is None and (lo, hi) == (-math.inf, math.inf)  # b has no in-harness gain: no ratio
    with pytest.raises(ValueError, match="four equal-length"):
        S.paired_ratio_difference(full, (noise[:10], v[:10]))
