"""The statistics the claims are judged with (DESIGN.md §5): intervals, the paired test, Holm, power.

Plain Python + numpy (no torch): the verdicts in `assets/claims.py` and the evaluators import it.
Legend: n tasks (or episodes) per cell, s successes, p = s/n, z the two-sided normal quantile
(Z95 = 1.96 at 95 %), α the test level, b / c the discordant pairs of a paired comparison (b: only
the new policy succeeds on the task, c: only the baseline does).

Intervals of a rate and of a difference of independent rates
- Wilson's score interval (Wilson 1927; Newcombe 1998a, method 3):
      centre = (p + z²/2n) / (1 + z²/n),   half = z·√(p(1−p)/n + z²/4n²) / (1 + z²/n)
- Newcombe's hybrid score interval of p₁ − p₂ for independent samples (Newcombe 1998a, method 10),
  from the two Wilson intervals (l₁, u₁), (l₂, u₂):
      [d − √((p₁−l₁)² + (u₂−p₂)²),  d + √((u₁−p₁)² + (p₂−l₂)²)]
- Katz's log interval of a ratio p₁/p₂ (Katz et al. 1978): log(p₁/p₂) ± z·√(1/s₁ − 1/n₁ + 1/s₂ − 1/n₂),
  0.5 added to a zero count.

Power of Newcombe's interval (two independent rates: a student and a control scored on their own
episodes; the MOPD equal-compute generalist control)
- Model: the baseline (arm 2) succeeds with its measured rate p₀ on each of n₂ episodes, the new
  policy (arm 1) with p₁ = p₀ ± δ on n₁; s₁ ~ Bin(n₁, p₁), s₂ ~ Bin(n₂, p₀) independent.
- Exact power of the rule "Newcombe's interval excludes 0 on the side of the true difference":
      P(δ) = Σ_{s₁, s₂} Bin(s₁; n₁, p₁)·Bin(s₂; n₂, p₀)·1[low(s₁, s₂) > 0]    (p₁ = p₀ + δ)
  (for −δ: high(s₁, s₂) < 0)
  summed over every count of probability > 10⁻¹⁶ (the rest holds < (n₁ + n₂)·10⁻¹⁶ of the mass). The
  power "at ±δ" is the smaller of the two directions (one only where the other leaves [0, 1]). The
  normal approximation Φ(δ / √(p₁q₁/n₁ + p₀q₀/n₂) − z) is within ~0.01 of it at a few hundred episodes
  an arm; the exact sum is used because it is the test that is read, at any n. Pooling cells of
  different rates into one binomial at the pooled rate overstates the variance (Σ nᶜpᶜqᶜ ≤ n·p̄q̄), so
  the figure is conservative there.

Paired comparison (claim 3: the specialist and sft_policy on the same tasks with the same sampling
seeds; Newcombe's interval above assumes independent samples and is too wide or too narrow for them)
- Exact McNemar test: under H₀ (no difference) b | b + c ~ Binomial(b + c, ½); the two-sided
  p-value is min(1, 2·min(P(B ≤ b), P(B ≥ b))).
- Agresti–Min interval of the paired difference d = (b − c)/n (Agresti & Min 2005, "Simple improved
  confidence intervals for comparing matched proportions"): add ½ to each of the four cells
  (b* = b + ½, c* = c + ½, n* = n + 2) and take the Wald interval
      d* = (b* − c*)/n*,   d* ± z·√((b* + c*) − (b* − c*)²/n*) / n*
- Holm's step-down correction across m tests (Holm 1979): sort the p-values p₍₁₎ ≤ … ≤ p₍ₘ₎;
  adjusted p₍ᵢ₎ = max_{j≤i} min(1, (m − j + 1)·p₍ⱼ₎); a test is rejected at α when its adjusted
  p-value is ≤ α.

Power of the paired test (before judging: from the baseline's measured rate p₀ and n)
- Model: each task is solved by the baseline with probability p₀ and by the new policy with
  p₁ = p₀ + δ. The discordance rate ψ = P(b) + P(c) is not measured before training; by default the
  two policies' outcomes on a task are taken as independent, ψ = p₁(1−p₀) + p₀(1−p₁). Policies that
  succeed on the same tasks (a specialist trained from the baseline) have a smaller ψ and more
  power, so the default is conservative; pass a measured ψ when one exists (it must be ≥ δ).
  Then P(b) = (ψ + δ)/2, P(c) = (ψ − δ)/2.
- Connor's normal approximation (Connor 1987, "Sample size for testing differences in proportions
  for the paired-sample design"):  power ≈ Φ((δ√n − z_{α/2}·√ψ) / √(ψ − δ²)).
- Exact power of the verdict rule: the sum of the trinomial probabilities of every (b, c) for which
  the rule passes (gain (b − c)/n ≥ the minimum gain, McNemar p ≤ α and the Agresti–Min lower bound
  > 0). Claim 3 uses α/m (Bonferroni, m = 9 cells): Holm's first step, so the figure is a lower bound
  on the power under Holm.
- The minimum n for power ≥ target: the exact power is a saw-tooth in n (discreteness), so
  `min_paired_n` scans upward from Connor's closed-form n and returns the first n at which the
  exact power reaches the target.

Paired comparison of per-task means (k samples per task; the same tasks and sampling seeds on both sides)
- Per task i the new policy solves sᵢ of k episodes, the baseline rᵢ of k; dᵢ = (sᵢ − rᵢ)/k, the gain
  d̄ = Σ dᵢ / n (pass@1 at the sampling temperature, estimated from k samples, minus the baseline's).
- Paired percentile bootstrap over tasks (Efron & Tibshirani 1993, §13): B resamples of n task
  indices with replacement, d̄* per resample; the 95 % interval is the 2.5 / 97.5 % quantiles of d̄*,
  and the two-sided p-value 2·min(P*(d̄* ≤ 0), P*(d̄* ≥ 0)) (the interval's inversion; floor 1/B).
  Tasks are resampled whole, so the k correlated samples of a task stay together.
- pass@k of a task from n ≥ k samples with c successes (Chen et al. 2021, the unbiased estimator):
      pass@k = 1 − C(n − c, k) / C(n, k)
- Power of the bootstrap rule (gain ≥ min_gain and lower bound > 0) at a true gain δ, by
  simulation from the baseline's measured per-task rates pᵢ = rᵢ/k (a plug-in): the new policy's
  rate on task i is qᵢ = pᵢ + δ·(1 − pᵢ)/(1 − p̄) (the gain spread in proportion to each task's
  headroom, so mean q = p̄ + δ with no qᵢ above 1; needs δ ≤ 1 − p̄); each draw samples
  sᵢ ~ Bin(k, qᵢ) and rᵢ' ~ Bin(k, pᵢ) independently (independent given the task: conservative, as
  in Connor's default) and applies the rule with the bootstrap interval. What it leaves out: two
  different policies' true per-task rates also differ task by task (not one smooth shift), which adds
  Var(qᵢ − pᵢ) over tasks to each dᵢ; where both arms are measured, `se_power` reads that from the data.
- Power from a measured standard error (the normal approximation of an interval d̄ ± z·SE): at a true
  difference δ, P(the interval excludes 0 on the true side) ≈ Φ(|δ|/SE − z), SE = sd(dᵢ)/√n from the
  measured per-task differences (or (high − low)/2z from a reported interval); at δ = 0 it is α/2.

Ratio of gains (claim 4's retention, claim 7's transfer of the RL gain)
- Retention pooled over the judged cells c with nᶜ tasks each:
      R = Σ_c nᶜ(p_studentᶜ − p_sftᶜ) / Σ_c nᶜ(p_teacherᶜ − p_sftᶜ) = U / V
  Its standard error by the delta method (ratio-estimator linearization, Cochran 1977 §6.3):
      Var(R) ≈ Var(U − R·V) / V²
  With per-task outcomes (paired: the same tasks for student, teacher and SFT) Var(U − R·V) is the
  stratified sum Σ_c nᶜ·var_c(zᵢ), zᵢ = (studentᵢ − sftᵢ) − R·(teacherᵢ − sftᵢ) (sample variance
  within the cell). With counts only the three arms are taken as independent binomials sharing the
  SFT term:  Var(U) = Σ nᶜ(pₛqₛ + p_f q_f), Var(V) = Σ nᶜ(pₜqₜ + p_f q_f), Cov(U, V) = Σ nᶜ p_f q_f,
  Var(U − R·V) = Var(U) − 2R·Cov(U, V) + R²·Var(V)   (q = 1 − p).
  The 95 % interval is R ± z·√Var(R).
- Transfer of an RL gain, one fold: R = (p_arm,held − p_sft,held) / (p_arm,in − p_sft,in), four
  independent binomials: Var(R) ≈ (v_arm,held + v_sft,held + R²(v_arm,in + v_sft,in)) / (p_arm,in −
  p_sft,in)², v = p(1−p)/n.
- Power of a ratio rule (point ≥ a, lower bound ≥ b) by simulation: binomial counts drawn at the
  true rates (e.g. a student identical to its teachers), the same interval computed on each draw.

Bad input: `require_power` refuses a budget or n whose pre-registered power is below the target,
with the numbers and the n that would reach it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

Z95 = 1.959963984540054  # Φ⁻¹(0.975)
POWER_TARGET = 0.8


def z_two_sided(alpha: float) -> float:
    """Φ⁻¹(1 − α/2)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    return NormalDist().inv_cdf(1 - alpha / 2)


def _check_count(s: float, n: int) -> None:
    if n < 0 or not 0 <= s <= max(n, 0):
        raise ValueError(f"need 0 ≤ successes ≤ n, got {s}, {n}")


# ----------------------------------------------------------------------------------------------
# Intervals of rates

def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval of a rate (module docstring); (0, 1) when n is 0."""
    _check_count(successes, n)
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe(s1: float, n1: int, s2: float, n2: int, z: float = Z95) -> tuple[float, float, float]:
    """(p₁ − p₂, low, high): Newcombe's hybrid score interval for two independent rates."""
    if n1 < 1 or n2 < 1:
        raise ValueError(f"both rates need n ≥ 1, got {n1}, {n2}")
    p1, p2 = s1 / n1, s2 / n2
    l1, u1 = wilson(s1, n1, z)
    l2, u2 = wilson(s2, n2, z)
    d = p1 - p2
    return d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def katz_ratio(s1: int, n1: int, s2: int, n2: int, z: float = Z95) -> tuple[float | None, float, float]:
    """(p₁/p₂, low, high): Katz's log interval for a ratio of independent rates; the ratio is None
    (and the interval (0, ∞)) when s₂ = 0."""
    for s, n in ((s1, n1), (s2, n2)):
        if n < 1 or not 0 <= s <= n:
            raise ValueError(f"need 0 ≤ successes ≤ n and n ≥ 1, got {s}, {n}")
    if s2 == 0:
        return None, 0.0, math.inf
    ratio = (s1 / n1) / (s2 / n2)
    a1, m1 = (s1, n1) if s1 > 0 else (0.5, n1 + 0.5)
    var = 1 / a1 - 1 / m1 + 1 / s2 - 1 / n2
    centre = math.log((a1 / m1) / (s2 / n2))
    half = z * math.sqrt(max(var, 0.0))
    return ratio, math.exp(centre - half), math.exp(centre + half)


# ----------------------------------------------------------------------------------------------
# Paired comparison

def paired_counts(new: dict[str, int], base: dict[str, int]) -> tuple[int, int, int]:
    """(b, c, n) from two {task id: 0 or 1} maps over the same tasks: b tasks only `new` solved, c
    only `base` solved, n tasks."""
    if set(new) != set(base):
        only = sorted(set(new) ^ set(base))[:3]
        raise ValueError(f"a paired comparison needs the same tasks on both sides; {only} are on one only")
    for d in (new, base):
        bad = [k for k, v in d.items() if v not in (0, 1)]
        if bad:
            raise ValueError(f"outcomes must be 0 or 1 per task (one sample each); {bad[:3]} are not")
    b = sum(1 for k in new if new[k] and not base[k])
    c = sum(1 for k in new if base[k] and not new[k])
    return b, c, len(new)


def _lgamma_table(n: int) -> np.ndarray:
    """log k! for k = 0 … n."""
    return np.array([math.lgamma(i + 1) for i in range(n + 1)])


def _binom_pmf(m: int, lg: np.ndarray | None = None) -> np.ndarray:
    """Binomial(m, ½) probabilities of 0 … m (`lg`: a log-factorial table of length ≥ m + 1)."""
    lg = _lgamma_table(m) if lg is None else lg
    k = np.arange(m + 1)
    return np.exp(lg[m] - lg[k] - lg[m - k] - m * math.log(2.0))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value (module docstring); 1 when there is no discordant pair."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be ≥ 0, got b={b}, c={c}")
    m = b + c
    if m == 0:
        return 1.0
    pmf = _binom_pmf(m)
    return float(min(1.0, 2 * min(pmf[: b + 1].sum(), pmf[b:].sum())))


def paired_difference(b: int, c: int, n: int, z: float = Z95) -> tuple[float, float, float]:
    """((b − c)/n, low, high): the Agresti–Min interval of a paired difference of rates."""
    if n < 1 or b < 0 or c < 0 or b + c > n:
        raise ValueError(f"need b, c ≥ 0 and b + c ≤ n ≥ 1, got b={b}, c={c}, n={n}")
    bs, cs, ns = b + 0.5, c + 0.5, n + 2
    d_star = (bs - cs) / ns
    half = z * math.sqrt(max((bs + cs) - (bs - cs) ** 2 / ns, 0.0)) / ns
    return (b - c) / n, max(-1.0, d_star - half), min(1.0, d_star + half)


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> tuple[list[float], list[bool]]:
    """Holm's step-down adjusted p-values (in the input order) and which tests are rejected at α."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    p = [float(x) for x in pvalues]
    if any(not 0 <= x <= 1 for x in p):
        raise ValueError(f"p-values must lie in [0, 1], got {p}")
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted, [a <= alpha for a in adjusted]


# ----------------------------------------------------------------------------------------------
# Power of Newcombe's interval (independent rates)

def _wilson_all(n: int, z: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, low, high) of Wilson's interval for every count s = 0 … n (`wilson`, vectorized)."""
    s = np.arange(n + 1)
    p = s / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return p, np.maximum(0.0, centre - half), np.minimum(1.0, centre + half)


def _binom_probable(n: int, p: float, lg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(counts, probabilities) of Bin(n, p) with probability > 1e-16."""
    s = np.arange(n + 1)
    pmf = np.exp(lg[n] - lg[s] - lg[n - s] + _klog(s, p) + _klog(n - s, 1.0 - p))
    keep = np.nonzero(pmf > 1e-16)[0]
    return keep, pmf[keep]


def newcombe_power(p0: float, effect: float, n1: int, n2: int, *, alpha: float = 0.05) -> float:
    """Exact power of "Newcombe's (1 − α) interval of p₁ − p₂ excludes 0 on the true side" (module
    docstring) when arm 1 (n1 episodes) truly succeeds `effect` above or below arm 2's rate p0 (n2
    episodes): the smaller of the two directions that stay inside [0, 1]."""
    if n1 < 1 or n2 < 1:
        raise ValueError(f"both arms need n ≥ 1 episodes, got n1={n1}, n2={n2}")
    if not 0 <= p0 <= 1:
        raise ValueError(f"the baseline rate p0 must lie in [0, 1], got {p0}")
    if not 0 < effect <= 1:
        raise ValueError(f"effect must lie in (0, 1] (a difference of rates to detect), got {effect}")
    directions = [d for d in (effect, -effect) if 0 <= p0 + d <= 1]
    if not directions:
        raise ValueError(f"neither p0 + effect nor p0 − effect lies in [0, 1] (p0={p0}, effect={effect}): "
                         "choose a smaller effect")
    z = z_two_sided(alpha)
    lg = _lgamma_table(max(n1, n2))
    f1, l1, u1 = _wilson_all(n1, z)
    f2, l2, u2 = _wilson_all(n2, z)
    s2, w2 = _binom_probable(n2, p0, lg)
    powers = []
    for d in directions:
        s1, w1 = _binom_probable(n1, p0 + d, lg)
        diff = f1[s1][:, None] - f2[s2][None, :]
        if d > 0:
            seen = diff - np.sqrt((f1[s1] - l1[s1])[:, None] ** 2 + (u2[s2] - f2[s2])[None, :] ** 2) > 0
        else:
            seen = diff + np.sqrt((u1[s1] - f1[s1])[:, None] ** 2 + (f2[s2] - l2[s2])[None, :] ** 2) < 0
        powers.append(float((w1[:, None] * w2[None, :] * seen).sum()))
    return min(1.0, min(powers))


# ----------------------------------------------------------------------------------------------
# Power of the paired test

def discordance(p0: float, effect: float, psi: float | None = None) -> tuple[float, float]:
    """(P(b), P(c)) per task for a baseline rate p₀ and a true gain δ: ψ from independence unless
    given (module docstring)."""
    p1 = p0 + effect
    if not (0 <= p0 <= 1 and 0 <= p1 <= 1):
        raise ValueError(f"need 0 ≤ p0 ≤ 1 and 0 ≤ p0 + effect ≤ 1, got p0={p0}, effect={effect}")
    if psi is None:
        psi = p1 * (1 - p0) + p0 * (1 - p1)
    if not abs(effect) <= psi <= 1:
        raise ValueError(f"the discordance rate must lie in [|effect|, 1], got {psi} for effect {effect}")
    return (psi + effect) / 2, (psi - effect) / 2


def connor_power(p0: float, effect: float, n: int, alpha: float = 0.05, psi: float | None = None) -> float:
    """Connor's normal approximation to the power of the two-sided McNemar test."""
    pb, pc = discordance(p0, effect, psi)
    psi_ = pb + pc
    if psi_ <= effect * effect:
        return 1.0 if effect != 0 else alpha
    num = abs(effect) * math.sqrt(n) - z_two_sided(alpha) * math.sqrt(psi_)
    return NormalDist().cdf(num / math.sqrt(psi_ - effect * effect))


def connor_n(p0: float, effect: float, power: float = POWER_TARGET, alpha: float = 0.05,
             psi: float | None = None) -> int:
    """Connor's closed-form n for the McNemar test: ⌈(z_{α/2}√ψ + z_β√(ψ − δ²))² / δ²⌉."""
    if effect == 0:
        raise ValueError("effect must be non-zero: no n detects a gain of 0")
    pb, pc = discordance(p0, effect, psi)
    psi_ = pb + pc
    zb = NormalDist().inv_cdf(power)
    return math.ceil((z_two_sided(alpha) * math.sqrt(psi_) + zb * math.sqrt(max(psi_ - effect ** 2, 0.0))) ** 2
                     / effect ** 2)


def _mcnemar_critical(n: int, alpha: float) -> np.ndarray:
    """crit[m]: the smallest b with a two-sided exact McNemar p ≤ α among m discordant pairs in the
    direction b > c (m + 1 when none)."""
    crit = np.full(n + 1, 0, dtype=np.int64)
    lg = _lgamma_table(n)
    for m in range(n + 1):
        if m == 0:
            crit[m] = 1
            continue
        tail = np.cumsum(_binom_pmf(m, lg)[::-1])[::-1]  # tail[b] = P(B ≥ b)
        ok = np.nonzero(np.minimum(1.0, 2 * tail) <= alpha)[0]
        # P(B ≥ b) ≤ P(B ≤ b) for b ≥ m/2, so the upper tail decides there.
        ok = ok[ok >= m / 2]
        crit[m] = ok[0] if ok.size else m + 1
    return crit


def paired_power(p0: float, effect: float, n: int, *, min_gain: float = 0.0, alpha: float = 0.05,
                 psi: float | None = None, z: float = Z95) -> float:
    """Exact probability that the paired rule passes (module docstring) when the true gain is
    `effect`: (b − c)/n ≥ min_gain, McNemar p ≤ α in the direction of a gain, and the Agresti–Min
    lower bound (at z) > 0."""
    if n < 1:
        raise ValueError(f"n must be ≥ 1, got {n}")
    pb, pc = discordance(p0, effect, psi)
    pe = max(0.0, 1.0 - pb - pc)
    lg = _lgamma_table(n)
    crit = _mcnemar_critical(n, alpha)
    b = np.arange(n + 1)[:, None]
    c = np.arange(n + 1)[None, :]
    valid = b + c <= n
    m = np.where(valid, b + c, 0)
    e = np.where(valid, n - b - c, 0)
    logp = lg[n] - lg[b] - lg[c] - lg[e] + _klog(b, pb) + _klog(c, pc) + _klog(e, pe)
    with np.errstate(invalid="ignore"):
        bs, cs, ns = b + 0.5, c + 0.5, n + 2
        lower = (bs - cs) / ns - z * np.sqrt(np.maximum((bs + cs) - (bs - cs) ** 2 / ns, 0.0)) / ns
    passes = valid & (b >= crit[m]) & ((b - c) >= min_gain * n - 1e-9) & (lower > 0)
    prob = np.where(passes, np.exp(np.where(valid, logp, -np.inf)), 0.0)
    return float(min(1.0, prob.sum()))


def _klog(k: np.ndarray, p: float) -> np.ndarray:
    """k · log p with 0 · log 0 = 0 (a cell of probability 0 that is never drawn)."""
    if p > 0:
        return k * math.log(p)
    return np.where(k == 0, 0.0, -np.inf)


def min_paired_n(p0: float, effect: float, *, target: float = POWER_TARGET, min_gain: float = 0.0,
                 alpha: float = 0.05, psi: float | None = None, n_max: int = 4096) -> int:
    """The first n (scanning up from Connor's closed form, 1.5× growth then one by one) at which the
    exact `paired_power` reaches `target`; a ValueError when none up to n_max does."""
    if effect <= min_gain:
        raise ValueError(f"a true gain of {effect} cannot pass a rule that needs ≥ {min_gain}: "
                         "choose an effect above the minimum gain")
    n = max(2, connor_n(p0, effect, target, alpha, psi) // 2)
    lo = 1
    while paired_power(p0, effect, n, min_gain=min_gain, alpha=alpha, psi=psi) < target:
        lo = n
        n = math.ceil(n * 1.5)
        if n > n_max:
            raise ValueError(f"no n ≤ {n_max} reaches power {target} at p0={p0}, effect={effect}")
    for k in range(lo + 1, n + 1):  # the first n that reaches it, past the saw-tooth
        if paired_power(p0, effect, k, min_gain=min_gain, alpha=alpha, psi=psi) >= target:
            return k
    return n


# ----------------------------------------------------------------------------------------------
# Paired comparison of per-task means (k samples per task)

def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased pass@k of one task from n samples with c successes (docstring): the
    chance that k of the n samples drawn without replacement hold a success."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 ≤ k ≤ n samples, got k = {k}, n = {n}: draw more samples or lower k")
    if not 0 <= c <= n:
        raise ValueError(f"successes must lie in 0 … n = {n}, got {c}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _bootstrap_means(d_N: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of `resamples` resamples (with replacement) of d_N, in chunks (memory ~ 8 MB a chunk)."""
    n = d_N.size
    out = np.empty(resamples)
    chunk = max(1, 1_000_000 // n)
    for at in range(0, resamples, chunk):
        m = min(chunk, resamples - at)
        out[at:at + m] = d_N[rng.integers(0, n, size=(m, n))].mean(axis=1)
    return out


def paired_bootstrap(new_N: Sequence[float], base_N: Sequence[float], *, resamples: int = 10_000,
                     alpha: float = 0.05, seed: int = 0) -> tuple[float, float, float, float]:
    """(d̄, low, high, p): the mean per-task difference new − base, its paired percentile-bootstrap
    (1 − α) interval and two-sided p-value (module docstring). `new_N`, `base_N`: per-task values
    (e.g. successes / k) on the same tasks, in the same order."""
    new, base = np.asarray(new_N, dtype=float), np.asarray(base_N, dtype=float)
    if new.shape != base.shape or new.ndim != 1 or new.size < 2:
        raise ValueError(f"need two equal-length 1-D per-task vectors of ≥ 2 tasks (the same tasks on both "
                         f"sides), got shapes {new.shape} and {base.shape}")
    if resamples < 100:
        raise ValueError(f"resamples must be ≥ 100 for a 95 % interval, got {resamples}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    d = new - base
    means = _bootstrap_means(d, resamples, np.random.default_rng(seed))
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    p = min(1.0, 2 * min((means <= 0).mean(), (means >= 0).mean()))
    return float(d.mean()), float(lo), float(hi), float(max(p, 1.0 / resamples))


def paired_mean_power(base_successes_N: Sequence[int], k: int, effect: float, *, min_gain: float = 0.0,
                      alpha: float = 0.05, sims: int = 400, resamples: int = 1000, seed: int = 0) -> float:
    """Simulated power of the paired-bootstrap rule on per-task means of k samples (module
    docstring): P(d̄ ≥ min_gain and the bootstrap lower bound > 0) when the new policy truly gains
    `effect` over the baseline whose per-task successes (of k) were measured as `base_successes_N`."""
    r = np.asarray(base_successes_N, dtype=np.int64)
    if r.ndim != 1 or r.size < 2 or k < 1 or (r < 0).any() or (r > k).any():
        raise ValueError(f"need ≥ 2 per-task success counts in [0, k] with k ≥ 1, got {r.size} counts, k={k}")
    p = r / k
    headroom = 1.0 - p.mean()
    if not 0 < effect <= headroom:
        raise ValueError(f"effect must lie in (0, 1 − baseline rate] = (0, {headroom:.3f}], got {effect}")
    q = p + effect * (1.0 - p) / headroom
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        d = (rng.binomial(k, q) - rng.binomial(k, p)) / k
        mean = d.mean()
        if mean < min_gain - 1e-12:
            continue
        lo = np.quantile(_bootstrap_means(d, resamples, rng), alpha / 2)
        hits += lo > 0
    return float(hits / sims)


def se_power(effect: float, se: float, *, alpha: float = 0.05) -> float:
    """Φ(effect/SE − z_{α/2}): the normal approximation to the power of a two-sided (1 − α) interval
    d̄ ± z·SE to exclude 0 on the side of a true difference `effect` (module docstring); 1 when SE is 0."""
    if not effect > 0:
        raise ValueError(f"effect must be > 0 (the size of the difference to detect), got {effect}")
    if not se >= 0:
        raise ValueError(f"the standard error must be ≥ 0, got {se}")
    if se == 0:
        return 1.0
    return NormalDist().cdf(effect / se - z_two_sided(alpha))


def noninferiority_power(base_successes_N: Sequence[int], k: int, margin: float, *, alpha: float = 0.05,
                         sims: int = 400, resamples: int = 1000, seed: int = 0) -> float:
    """Simulated power of "new is not worse than base by `margin`" on per-task means of k samples: P(the
    paired-bootstrap lower bound of new − base > −margin) when new truly equals base task by task, both
    arms drawn afresh at the per-task rates measured for base (`base_successes_N`, counts of k)."""
    r = np.asarray(base_successes_N, dtype=np.int64)
    if r.ndim != 1 or r.size < 2 or k < 1 or (r < 0).any() or (r > k).any():
        raise ValueError(f"need ≥ 2 per-task success counts in [0, k] with k ≥ 1, got {r.size} counts, k={k}")
    if not 0 < margin < 1:
        raise ValueError(f"margin must lie in (0, 1), got {margin}")
    p = r / k
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        d = (rng.binomial(k, p) - rng.binomial(k, p)) / k
        hits += np.quantile(_bootstrap_means(d, resamples, rng), alpha / 2) > -margin
    return float(hits / sims)


# ----------------------------------------------------------------------------------------------
# Ratios of gains

def paired_gain_ratio(cells: Sequence[tuple[Sequence[float], Sequence[float]]],
                      z: float = Z95) -> tuple[float | None, float, float]:
    """(R, low, high): R = Σu / Σv pooled over cells of per-task gains (u, v on the same tasks of a
    cell), with the paired delta-method interval Var(R) = Σ_cells n·Var(u − R·v) / (Σv)². R is None
    when Σv ≤ 0 (no gain to keep or to transfer)."""
    if not cells:
        raise ValueError("no cells to pool")
    u_sum = v_sum = 0.0
    arrays = []
    for u, v in cells:
        u_, v_ = np.asarray(u, dtype=float), np.asarray(v, dtype=float)
        if u_.shape != v_.shape or u_.ndim != 1 or u_.size < 2:
            raise ValueError("each cell needs two per-task vectors over the same ≥ 2 tasks")
        u_sum += u_.sum()
        v_sum += v_.sum()
        arrays.append((u_, v_))
    if v_sum <= 0:
        return None, -math.inf, math.inf
    r = float(u_sum / v_sum)
    var = float(sum(len(u) * np.var(u - r * v, ddof=1) for u, v in arrays)) / v_sum ** 2
    half = z * math.sqrt(var)
    return r, r - half, r + half


def paired_ratio_difference(a: tuple[Sequence[float], Sequence[float]], b: tuple[Sequence[float], Sequence[float]],
                            *, resamples: int = 10_000, alpha: float = 0.05,
                            seed: int = 0) -> tuple[float | None, float, float, float]:
    """(D, low, high, undefined): D = R_a − R_b, each R = Σu / Σv over the same tasks (a's and b's per-task
    gains (u, v) in the same task order, as `paired_gain_ratio`), with the percentile-bootstrap (1 − α)
    interval of D from resampling the tasks jointly for both arms. `undefined`: the share of resamples
    where either Σv ≤ 0; when it exceeds α/2 the interval is (−inf, inf), and D is None when either
    ratio is undefined on the tasks themselves."""
    arrays = [np.asarray(x, dtype=float) for x in (*a, *b)]
    if any(x.shape != arrays[0].shape or x.ndim != 1 for x in arrays) or arrays[0].size < 2:
        raise ValueError("need four equal-length per-task vectors (u, v of each arm) over the same ≥ 2 tasks")
    if resamples < 100:
        raise ValueError(f"resamples must be ≥ 100 for a 95 % interval, got {resamples}")
    u_a, v_a, u_b, v_b = arrays
    if v_a.sum() <= 0 or v_b.sum() <= 0:
        return None, -math.inf, math.inf, 1.0
    d = float(u_a.sum() / v_a.sum() - u_b.sum() / v_b.sum())
    idx = np.random.default_rng(seed).integers(0, u_a.size, size=(resamples, u_a.size))
    sums = [x[idx].sum(axis=1) for x in arrays]
    ok = (sums[1] > 0) & (sums[3] > 0)
    undefined = float(1 - ok.mean())
    if undefined > alpha / 2:
        return d, -math.inf, math.inf, undefined
    ds = sums[0][ok] / sums[1][ok] - sums[2][ok] / sums[3][ok]
    lo, hi = np.quantile(ds, [alpha / 2, 1 - alpha / 2])
    return d, float(lo), float(hi), undefined


def retention_from_outcomes(student: Sequence[Sequence[int]], teacher: Sequence[Sequence[int]],
                            sft: Sequence[Sequence[int]], z: float = Z95) -> tuple[float | None, float, float]:
    """(R, low, high): pooled retention Σ(student − sft)/Σ(teacher − sft) over cells of per-task
    outcomes (0/1, or means of k samples), the three lists of each cell on the same tasks
    (`paired_gain_ratio`)."""
    if not (len(student) == len(teacher) == len(sft)) or not student:
        raise ValueError("student, teacher and sft need the same, non-zero number of cells")
    cells = []
    for s, t, f in zip(student, teacher, sft):
        s_, t_, f_ = (np.asarray(x, dtype=float) for x in (s, t, f))
        if not (s_.shape == t_.shape == f_.shape) or s_.size < 2:
            raise ValueError("each cell needs the same ≥ 2 tasks for student, teacher and sft")
        cells.append((s_ - f_, t_ - f_))
    return paired_gain_ratio(cells, z)


def retention_from_counts(cells: Sequence[tuple[float, float, float, int]],
                          z: float = Z95) -> tuple[float | None, float, float]:
    """(R, low, high) from per-cell (student, teacher, sft success rate, n): independent binomials
    sharing the SFT term (docstring). R is None when the pooled teacher gain is ≤ 0."""
    if not cells:
        raise ValueError("no cells to pool")
    u = v = var_u = var_v = cov = 0.0
    for ps, pt, pf, n in cells:
        if n < 1 or not all(0 <= p <= 1 for p in (ps, pt, pf)):
            raise ValueError(f"need rates in [0, 1] and n ≥ 1, got {(ps, pt, pf, n)}")
        u += n * (ps - pf)
        v += n * (pt - pf)
        var_u += n * (ps * (1 - ps) + pf * (1 - pf))
        var_v += n * (pt * (1 - pt) + pf * (1 - pf))
        cov += n * pf * (1 - pf)
    if v <= 0:
        return None, -math.inf, math.inf
    r = u / v
    half = z * math.sqrt(max(var_u - 2 * r * cov + r * r * var_v, 0.0)) / v
    return r, r - half, r + half


def gain_ratio(held: tuple[float, float], held_n: tuple[int, int], inside: tuple[float, float],
               inside_n: tuple[int, int], z: float = Z95) -> tuple[float | None, float, float]:
    """(R, low, high) of (p_arm,held − p_sft,held)/(p_arm,in − p_sft,in), four independent rates:
    `held` = (arm, sft) rates in the held-out harness, `inside` = (arm, sft) in the trained ones."""
    (ah, sh), (nah, nsh), (ai, si), (nai, nsi) = held, held_n, inside, inside_n
    den = ai - si
    if den <= 0:
        return None, -math.inf, math.inf
    r = (ah - sh) / den
    var = (ah * (1 - ah) / nah + sh * (1 - sh) / nsh + r * r * (ai * (1 - ai) / nai + si * (1 - si) / nsi)) / den ** 2
    half = z * math.sqrt(var)
    return r, r - half, r + half


def retention_power(cells: Sequence[tuple[float, float, int]], *, retained: float = 1.0, point: float = 0.9,
                    lower: float = 0.7, sims: int = 4000, seed: int = 0) -> float:
    """P(pooled R̂ ≥ point and its lower bound ≥ lower) when the student truly keeps `retained` of
    each teacher's gain; `cells`: (teacher rate, sft rate, n) as measured. Simulated binomials,
    `retention_from_counts` on each draw."""
    rng = np.random.default_rng(seed)
    pt = np.array([c[0] for c in cells], dtype=float)
    pf = np.array([c[1] for c in cells], dtype=float)
    n = np.array([c[2] for c in cells], dtype=np.int64)
    ps = np.clip(pf + retained * (pt - pf), 0.0, 1.0)
    hits = 0
    for _ in range(sims):
        draw = [rng.binomial(n, p) / n for p in (ps, pt, pf)]
        r, lo, _ = retention_from_counts(list(zip(draw[0], draw[1], draw[2], n.tolist())))
        hits += r is not None and r >= point and lo >= lower
    return float(hits / sims)


def retention_power_paired(teacher: Sequence[Sequence[int]], sft: Sequence[Sequence[int]], k: int, *,
                           retained: float = 1.0, point: float = 0.9, lower: float = 0.7, sims: int = 1000,
                           seed: int = 0, z: float = Z95) -> float:
    """P(pooled R̂ ≥ point and its lower bound ≥ `lower`) of `retention_from_outcomes` on per-task means of
    k samples, when the student truly keeps `retained` of each task's teacher gain. `teacher`, `sft`: per
    cell, the per-task success counts (of k) already measured on the same tasks; they are the test's fixed
    data, so the student's draw is the only new one (the power given what was measured). `z`: the
    interval's, as the test will use it (a second look takes a wider one)."""
    if len(teacher) != len(sft) or not teacher or k < 1:
        raise ValueError("need the same, non-zero number of cells for teacher and sft, and k ≥ 1")
    rng = np.random.default_rng(seed)
    t = [np.asarray(c, dtype=float) / k for c in teacher]
    f = [np.asarray(c, dtype=float) / k for c in sft]
    q = [np.clip(fi + retained * (ti - fi), 0.0, 1.0) for ti, fi in zip(t, f)]
    hits = 0
    for _ in range(sims):
        student = [rng.binomial(k, qi) / k for qi in q]
        r, lo, _ = retention_from_outcomes(student, t, f, z=z)
        hits += r is not None and r >= point and lo >= lower
    return float(hits / sims)


def transfer_power_paired(sft_held: Sequence[int], sft_in: Sequence[int], k: int, effect: float, *,
                          transfer: float = 1.0, point: float = 0.8, sims: int = 1000, seed: int = 0) -> float:
    """P(R̂ ≥ point) for one transfer fold judged on per-task means of k samples, R = Σ(arm − sft)
    held-out / Σ(arm − sft) in-harness over the same tasks (`paired_gain_ratio`), when the arm truly
    gains `effect` in its trained harnesses (spread over tasks in proportion to each task's headroom,
    as `paired_mean_power` does) and `transfer` of that in the held-out one; sft_policy's measured
    per-task counts are the fixed data, the arm's two draws the only new ones."""
    f_h, f_in = np.asarray(sft_held, dtype=float) / k, np.asarray(sft_in, dtype=float) / k
    if f_h.shape != f_in.shape or f_h.size < 2:
        raise ValueError("need the same ≥ 2 tasks in both harness settings")
    if not 0 < effect <= 1 - f_in.mean():
        raise ValueError(f"effect must lie in (0, 1 − in-harness rate] = (0, {1 - f_in.mean():.3f}], got {effect}")
    q_in = f_in + effect * (1 - f_in) / (1 - f_in.mean())
    held_gain = min(transfer * effect, 1 - f_h.mean())
    q_h = np.clip(f_h + held_gain * (1 - f_h) / max(1 - f_h.mean(), 1e-12), 0.0, 1.0)
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        a_h, a_in = rng.binomial(k, q_h) / k, rng.binomial(k, q_in) / k
        r, _, _ = paired_gain_ratio([(a_h - f_h, a_in - f_in)])
        hits += r is not None and r >= point
    return float(hits / sims)


def gain_ratio_power(held: tuple[float, float], held_n: tuple[int, int], inside: tuple[float, float],
                     inside_n: tuple[int, int], *, transfer: float = 1.0, point: float = 0.8,
                     lower: float | None = None, sims: int = 4000, seed: int = 0) -> float:
    """P(R̂ ≥ point (and its lower bound ≥ `lower` when given)) for one transfer fold whose arm truly
    keeps `transfer` of its in-harness gain in the held-out harness; rates as measured (the arm's
    held-out rate is replaced by sft + transfer · in-harness gain)."""
    rng = np.random.default_rng(seed)
    ah = min(1.0, max(0.0, held[1] + transfer * (inside[0] - inside[1])))
    hits = 0
    for _ in range(sims):
        r = [rng.binomial(k, p) / k for p, k in ((ah, held_n[0]), (held[1], held_n[1]), (inside[0], inside_n[0]),
                                                 (inside[1], inside_n[1]))]
        ratio, lo, _ = gain_ratio((r[0], r[1]), held_n, (r[2], r[3]), inside_n)
        hits += ratio is not None and ratio >= point and (lower is None or lo >= lower)
    return float(hits / sims)


# ----------------------------------------------------------------------------------------------
# Refusing what cannot show the effect

def require_power(power: float, *, what: str, n: int, needed_n: int | None = None,
                  target: float = POWER_TARGET) -> None:
    """A ValueError with the numbers when a pre-registered test's power is below `target`."""
    if power >= target:
        return
    more = f"; n ≥ {needed_n} per cell reaches it" if needed_n is not None else ""
    raise ValueError(f"{what}: n = {n} per cell gives power {power:.2f} < {target:.2f}{more}. "
                     "Raise n (or the budget) rather than judge a test that cannot show the effect")


def require_paired_n(n: int, p0: float, effect: float, *, min_gain: float = 0.0, alpha: float = 0.05,
                     psi: float | None = None, target: float = POWER_TARGET, what: str = "paired test") -> float:
    """The exact power at n; a ValueError with the power and the n that reaches `target` when it is short."""
    power = paired_power(p0, effect, n, min_gain=min_gain, alpha=alpha, psi=psi)
    if power < target:
        need = min_paired_n(p0, effect, target=target, min_gain=min_gain, alpha=alpha, psi=psi)
        require_power(power, what=f"{what} (baseline {p0:.2f}, true gain {effect * 100:+.0f} points)", n=n,
                      needed_n=need, target=target)
    return power
