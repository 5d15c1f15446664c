"""The claim verdicts (assets/claims.py) on hand-made figures: each claim passes, fails and is
"not measured" where it should, with the intervals computed by hand."""

import math

import pytest

from assets import claims
from assets.claims import DOMAINS, EFFORTS, FAIL, NOT_MEASURED, PASS, UNDERPOWERED
from k3model.train import stats

P = {"profile": "smoke"}


def test_wilson_by_hand():
    # p = 0.5, n = 100: centre 0.5, half-width z·sqrt(0.25/100 + z²/40000) / (1 + z²/100).
    z = claims.Z95
    half = z * math.sqrt(0.0025 + z * z / 40000) / (1 + z * z / 100)
    assert claims.wilson(50, 100) == pytest.approx((0.5 - half, 0.5 + half))
    lo, hi = claims.wilson(0, 3)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(z * z / 3 / (1 + z * z / 3))  # 0 of 3: upper z²/(n+z²)
    assert claims.wilson(0, 0) == (0.0, 1.0)


def test_rate_difference_is_newcombe():
    d, lo, hi = claims.rate_difference(8, 10, 2, 10)
    l1, u1 = claims.wilson(8, 10)
    l2, u2 = claims.wilson(2, 10)
    assert d == pytest.approx(0.6)
    assert lo == pytest.approx(0.6 - math.sqrt((0.8 - l1) ** 2 + (u2 - 0.2) ** 2))
    assert hi == pytest.approx(0.6 + math.sqrt((u1 - 0.8) ** 2 + (0.2 - l2) ** 2))
    assert 0 < lo < d < hi < 1


def _stage(scattered, control):
    return {"scattered": scattered, "control": control}


def test_claim_1_passes_when_a_later_stage_answers_where_an_earlier_fails_for_distance():
    stages = {1: _stage({"0-32": (10, 12), "256-1024": (0, 12)}, {"0-32": (11, 12), "256-1024": (11, 12)}),
              4: _stage({"0-32": (11, 12), "256-1024": (10, 12)}, {"0-32": (12, 12), "256-1024": (11, 12)})}
    c = claims.claim_1(stages, profile="tiny", checkpoints={"pretrain_stage_1": "aa", "pretrain_stage_4": "bb"})
    assert c.status == PASS and c.figure.startswith("d256-1024: stage 4 0.83")
    assert c.checkpoints == {"pretrain_stage_1": "aa", "pretrain_stage_4": "bb"} and c.profile == "tiny"


def test_claim_1_fails_when_the_control_twins_fail_too():
    # Stage 4 is better, but stage 1 cannot answer even with the clues beside the question: it had not
    # learned the task, so distance is not what stage 4 overcame.
    stages = {1: _stage({"256-1024": (0, 12)}, {"256-1024": (0, 12)}),
              4: _stage({"256-1024": (10, 12)}, {"256-1024": (11, 12)})}
    c = claims.claim_1(stages, **P)
    assert c.status == FAIL and "no later stage" in c.reason


def test_claim_1_fails_when_the_intervals_overlap_and_is_not_measured_without_two_stages():
    stages = {1: _stage({"256-1024": (0, 3)}, {"256-1024": (3, 3)}),
              2: _stage({"256-1024": (2, 3)}, {"256-1024": (3, 3)})}
    assert claims.claim_1(stages, **P).status == FAIL  # 0/3 vs 2/3: Wilson intervals overlap
    assert claims.claim_1({1: stages[1]}, **P).status == NOT_MEASURED
    assert claims.claim_1({1: stages[1], 2: _stage({}, {})}, **P).status == NOT_MEASURED


def test_claim_2():
    assert claims.claim_2({"stage_1": 1.3, "stage_2": 1.45}, {"none": 3.2}, **P).status == PASS
    drifts_too_little = claims.claim_2({"stage_1": 1.3}, {"none": 1.6}, **P)
    assert drifts_too_little.status == FAIL and "1.60 < 1.5× 1.30" in drifts_too_little.reason
    not_near = claims.claim_2({"stage_1": 2.1}, {"none": 4.0}, **P)
    assert not_near.status == FAIL and "2.10 > 1.5" in not_near.reason
    without = claims.claim_2({"stage_1": 1.3}, {}, **P)
    assert without.status == NOT_MEASURED and "with stage_1 1.30" in without.figure
    assert claims.claim_2({}, {"none": 3.0}, **P).status == NOT_MEASURED


def test_claim_2_shows_its_basis_spread_and_dead_experts():
    c = claims.claim_2({"stage 1": 1.2}, {"stage 1": 2.0}, **P, basis="held-out mixed set, 65512 tokens",
                       without_source="bias zeroed", dead={"stage 1": 0.125}, spread={"stage 1": {"sd": 0.11, "max": 1.48}})
    assert c.status == PASS
    assert "held-out mixed set, 65512 tokens" in c.figure and "0.11/1.48" in c.figure and "12%" in c.figure
    assert "(bias zeroed)" in c.figure
    assert c.figures["dead_fraction"] == {"stage 1": 0.125} and c.figures["per_batch"]["stage 1"]["max"] == 1.48


def test_claim_2_judges_a_trained_without_arm_against_its_twin_at_equal_steps():
    """An unbalanced arm of a few steps is compared with the balanced arm of the same steps, not with
    the lineage's worst stage; the stages must still stay near k/N."""
    withs = {"stage 1": 1.30, "stage 2": 1.45, "arm quantile, 100 steps": 1.10}
    pair = {"arm none, 100 steps": "arm quantile, 100 steps"}
    passed = claims.claim_2(withs, {"arm none, 100 steps": 1.80}, **P, drift_against=pair)
    # 1.80 ≥ 1.5 × 1.10, though < 1.5 × 1.45 (the worst stage): the twin decides.
    assert passed.status == PASS and passed.figures["drift_against"] == pair
    assert claims.claim_2(withs, {"arm none, 100 steps": 1.80}, **P).status == FAIL  # against the worst
    short = claims.claim_2(withs, {"arm none, 100 steps": 1.60}, **P, drift_against=pair)
    assert short.status == FAIL and "arm none, 100 steps 1.60 < 1.5× 1.10 (arm quantile, 100 steps)" in short.reason
    not_near = claims.claim_2({**withs, "stage 3": 1.64}, {"arm none, 100 steps": 2.0}, **P, drift_against=pair)
    assert not_near.status == FAIL and "1.64 > 1.5" in not_near.reason and "without" not in not_near.reason
    with pytest.raises(ValueError, match="names one that is not there"):
        claims.claim_2(withs, {"arm none, 100 steps": 2.0}, **P, drift_against={"arm none, 100 steps": "stage 9"})


def _specialists(rate=0.6, n=900, tokens=(10, 20, 40), hard=(0.2, 0.3), b=None, c=10):
    """Specialists at `rate` against SFT at 0.3 on the same n tasks: b tasks only the specialist
    solved, c only SFT (b − c = (rate − 0.3)·n)."""
    b = round((rate - 0.3) * n) + c if b is None else b
    return {(d, e): {"success_rate": rate, "n": n, "mean_policy_tokens": tokens[i],
                     "hard": {"success_rate": hard[0] if e == "low" else hard[1], "n": 50},
                     "paired": {"b": b, "c": c, "n": n}}
            for d in DOMAINS for i, e in enumerate(EFFORTS)}


def _sft(n=900, hard_low=0.1):
    return {(d, e): {"success_rate": 0.3, "n": n, **({"hard": {"success_rate": hard_low, "n": 50}} if e == "low" else {})}
            for d in DOMAINS for e in EFFORTS}


def test_claim_3_power_is_computed_from_sfts_rate_and_n():
    # At SFT 0.3 and n 400 each cell's paired rule has power ≥ 0.8 at a true +15 points (α/9), but all
    # nine together only ~0.54; n 900 gives all nine ≥ 0.8. At n 64 no cell has it.
    assert claims.claim_3_power(0.3, 400) >= 0.8 > claims.claim_3_power(0.3, 64)
    assert claims.claim_3_power(0.3, 400) ** 9 < 0.8 <= claims.claim_3_power(0.3, 900) ** 9
    assert claims.claim_3_power(0.3, 400) == pytest.approx(
        stats.paired_power(0.3, 0.15, 400, min_gain=0.10, alpha=0.05 / 9))
    assert claims.claim_3_power(0.95, 10_000) == 0.0  # no room for +10 points above 0.95


def test_a_held_out_n_below_the_pre_registered_power_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"claim 3 held-out evaluation .*n = 64 per cell gives power 0\.\d\d < 0\.98; "
                                         r"n ≥ \d+ per cell reaches it"):
        claims.require_claim_3_n(0.3, 64)
    with pytest.raises(ValueError, match=r"n = 400 per cell"):  # each cell ≥ 0.8, all nine not
        claims.require_claim_3_n(0.3, 400)
    assert claims.require_claim_3_n(0.3, 900) >= 0.8 ** (1 / 9)
    with pytest.raises(ValueError, match="no room"):
        claims.require_claim_3_n(0.95, 400)


def test_claim_3_passes():
    c = claims.claim_3(_sft(), _specialists(), **P)
    assert c.status == PASS and c.figure.startswith("9/9 specialists beat SFT")
    g = c.figures["gains"]["coding_agents/max"]
    # b = 280, c = 10 of 900: gain 0.30, the Agresti–Min interval and McNemar's exact test.
    assert g["gain"] == pytest.approx(0.3) and (g["lo"], g["hi"]) == pytest.approx(stats.paired_difference(280, 10, 900)[1:])
    assert g["p_mcnemar"] == pytest.approx(stats.mcnemar_exact(280, 10)) and g["p_holm"] <= 0.05
    # The claim's power: all nine cells pass at a true +15 points.
    assert c.n == 900 and c.power == pytest.approx(claims.claim_3_power(0.3, 900) ** 9) and c.power >= 0.8
    assert c.as_dict()["n"] == 900 and c.as_dict()["power"] == c.power
    assert c.figures["hard"]["general_tasks"] == "pass"


@pytest.mark.parametrize("spec, why", [
    (_specialists(rate=0.38), "gains +8 points"),                       # below +10
    # No "Holm p" case: at an n where the claim is powered (900), a gain ≥ +10 points has b − c ≥ 90 of
    # at most 900 discordant tasks, z ≥ 3, so McNemar's p ≤ 0.003 clears Holm's α/9; stats tests Holm.
    (_specialists(tokens=(20, 20, 40)), "tokens low/high/max 20/20/40 not increasing"),
    (_specialists(hard=(0.3, 0.2)), "hard max 0.20 < low 0.30"),
])
def test_claim_3_fails(spec, why):
    c = claims.claim_3(_sft(), spec, **P)
    assert c.status == FAIL and why in c.reason


def test_claim_3_underpowered_is_never_pass_or_fail():
    # +30 points at n = 8 per cell: the rule alone would fail (the interval reaches 0), but power at
    # +15 is far below 0.8, so the claim reads underpowered, with the figures.
    c = claims.claim_3(_sft(n=8), _specialists(n=8, c=0), **P)
    assert c.status == claims.UNDERPOWERED and c.power < 0.8 and c.n == 8
    assert "the rule alone reads fail" in c.reason and c.figures["gains"]["general_tasks/low"]["gain"] == pytest.approx(0.25)
    assert c.line().startswith("claim 3 ~ underpowered:") and "power 0." in c.line()


def test_claim_3_hard_split_is_judged_only_where_sft_at_low_is_below_half():
    c = claims.claim_3(_sft(hard_low=0.6), _specialists(hard=(0.3, 0.2)), **P)
    assert c.status == PASS and c.figures["hard"]["general_tasks"].startswith("not judged: sft_policy at low scores 0.60")
    zero = claims.claim_3(_sft(), _specialists(hard=(0.0, 0.0)), **P)
    assert zero.status == PASS and "0 ≥ 0 says nothing" in zero.figures["hard"]["coding_agents"]


def test_claim_3_missing_parts():
    spec = _specialists()
    del spec[("general_tasks", "low")]
    c = claims.claim_3(_sft(), spec, **P)
    assert c.status == FAIL and "general_tasks/low: specialist not measured" in c.reason
    unpaired = _specialists()
    del unpaired[("coding_agents", "high")]["paired"]
    c = claims.claim_3(_sft(), unpaired, **P)
    assert c.status == FAIL and "coding_agents/high: paired outcomes (b, c) not reported" in c.reason
    assert claims.claim_3(_sft(), {}, **P).status == NOT_MEASURED


def _cells4(student=0.5, teacher=0.5, sft=0.3, n=512):
    return {(d, e): {"teacher": teacher, "student": student, "sft": sft, "n": n} for d in DOMAINS for e in EFFORTS}


def test_claim_4_judges_the_pooled_retained_gain_with_its_lower_bound():
    c = claims.claim_4(_cells4(student=0.49), **P)
    # Pooled over nine equal cells: (0.49 − 0.3)/(0.5 − 0.3) = 0.95, the interval by the delta method.
    r, lo, _ = stats.retention_from_counts([(0.49, 0.5, 0.3, 512)] * 9)
    assert c.status == PASS and c.figures["pooled"] == pytest.approx(0.95) and c.figures["pooled_lo"] == pytest.approx(lo)
    assert c.power >= 0.8 and c.n == 512
    low = claims.claim_4(_cells4(student=0.46), **P)  # 80 % retained
    assert low.status == FAIL and "retained 80%" in low.reason


def test_claim_4_cells_where_the_teacher_does_not_beat_sft_have_nothing_to_retain():
    cells = _cells4(student=0.49)
    cells[("general_tasks", "low")].update(teacher=0.31, student=0.0)  # no real gain: not judged
    c = claims.claim_4(cells, **P)
    assert c.status == PASS and c.figures["cells"]["general_tasks/low"]["retention"] == "nothing to retain"
    # The paired test decides when the pairs are given: b 20, c 15 of 512 is no win.
    cells[("general_agents", "max")]["paired"] = {"b": 20, "c": 15, "n": 512}
    assert claims.claim_4(cells, **P).figures["cells"]["general_agents/max"]["judged"] is False
    none = claims.claim_4(_cells4(teacher=0.3), **P)
    assert none.status == NOT_MEASURED and "nothing to retain" in none.reason
    assert claims.claim_4({}, **P).status == NOT_MEASURED


def test_claim_4_reads_a_student_of_fewer_cells_and_names_the_rest_not_distilled():
    nine = claims.claim_4(_cells4(student=0.49), **P)
    assert "not_distilled" not in nine.figures and "not distilled" not in nine.figure
    three = {c: v for c, v in _cells4(student=0.49).items() if c[0] == "general_tasks"}
    c = claims.claim_4(three, **P)
    r, lo, _ = stats.retention_from_counts([(0.49, 0.5, 0.3, 512)] * 3)
    # Judged on the three distilled cells alone: the six others are no failure, only named.
    assert c.figures["pooled"] == pytest.approx(r) and c.figures["pooled_lo"] == pytest.approx(lo)
    assert set(c.figures["cells"]) == {"general_tasks/low", "general_tasks/high", "general_tasks/max"}
    assert len(c.figures["not_distilled"]) == 6 and "general_agents/low" in c.figures["not_distilled"]
    assert c.figure.endswith("; 0 with nothing to retain; 6 of 9 not distilled") and c.status != FAIL


def test_claim_4_is_underpowered_at_the_audits_sizes():
    # Eight tasks per cell, teachers 5/8 against SFT's 1/8: an identical student passes about half the time.
    c = claims.claim_4(_cells4(student=0.625, teacher=0.625, sft=0.125, n=8), **P)
    assert c.status == claims.UNDERPOWERED and c.power < 0.8


def test_claim_5():
    nll = {"metric": "held-out NLL", "higher_is_better": False, **P}
    # PTQ +0.040 nats (seeds 0.038 / 0.042: spread 0.004, 10× below the drop), QAT +0.008: 20 % of it.
    judged = {"seed_drops": {"ptq": [0.038, 0.042], "qat": [0.007, 0.009]}, "n": 8}
    c = claims.claim_5({"bf16": 3.0, "mxfp4": 3.008}, {"bf16": 3.0, "mxfp4": 3.040}, **nll, **judged)
    assert c.status == PASS and "20% of PTQ's drop" in c.reason and c.n == 8 and c.power is None
    assert "not a sampling test" in c.figures["power_note"]
    c = claims.claim_5({"bf16": 3.0, "mxfp4": 3.025}, {"bf16": 3.0, "mxfp4": 3.040}, **nll, **judged)
    assert c.status == FAIL and "62% of PTQ's drop" in c.reason
    # A drop below 0.01 nats, or within 5× the seed spread, is shown, not judged.
    tiny = claims.claim_5({"bf16": 3.0, "mxfp4": 3.0}, {"bf16": 3.0, "mxfp4": 3.005}, **nll,
                          seed_drops={"ptq": [0.005, 0.005]}, n=8)
    assert tiny.status == UNDERPOWERED and "below 0.01" in tiny.reason
    noisy = claims.claim_5({"bf16": 3.0, "mxfp4": 3.0}, {"bf16": 3.0, "mxfp4": 3.04}, **nll,
                           seed_drops={"ptq": [0.03, 0.05]}, n=8)
    assert noisy.status == UNDERPOWERED and "seed spread" in noisy.reason
    one_seed = claims.claim_5({"bf16": 3.0, "mxfp4": 3.0}, {"bf16": 3.0, "mxfp4": 3.04}, **nll,
                              seed_drops={"ptq": [0.04]})
    assert one_seed.status == UNDERPOWERED and "fewer than two seeds" in one_seed.reason
    # A higher-is-better metric: the drop is the fall.
    acc = {"metric": "success_rate", "higher_is_better": True, **P}
    assert claims.claim_5({"bf16": 0.60, "mxfp4": 0.58}, {"bf16": 0.60, "mxfp4": 0.50}, **acc,
                          seed_drops={"ptq": [0.1, 0.1]}).status == PASS
    assert claims.claim_5({"bf16": 1.0}, {"bf16": 1.0, "mxfp4": 0.5}, **acc).status == NOT_MEASURED


def test_claim_6():
    assert claims.claim_6({1: 1.7, 2: 2.2, 4: 2.8}, 1.4, True, **P).status == PASS
    short = claims.claim_6({4: 2.1}, 1.4, True, **P)
    assert short.status == FAIL and "2.10 < 2.5" in short.reason
    assert "speculative output differs" in claims.claim_6({4: 3.0}, 1.4, False, **P).reason
    assert "no speedup" in claims.claim_6({4: 3.0}, 0.9, True, **P).reason
    assert claims.claim_6({4: 3.0}, None, True, **P).status == FAIL
    assert claims.claim_6({}, 1.4, True, **P).status == NOT_MEASURED


def _fold(held, inside, sft_held=0.2, sft_in=0.2, n=1024):
    return {"in_harness": inside, "held_out": held, "sft_in_harness": sft_in, "sft_held_out": sft_held,
            "n_in_harness": n, "n_held_out": n}


def test_claim_7_scores_the_transfer_of_the_rl_gain():
    c = claims.claim_7({"xml": _fold(0.45, 0.5), "json": _fold(0.46, 0.5)}, **P)
    # Gains +25 / +30 and +26 / +30 points: 83 % and 87 % transferred.
    assert c.status == PASS and c.figures["transfer"]["xml"]["transfer"] == pytest.approx(25 / 30)
    assert c.power >= 0.8 and c.n == 1024
    worse = claims.claim_7({"xml": _fold(0.45, 0.5), "json": _fold(0.34, 0.4)}, control={"xml": 0.2}, **P)
    assert worse.status == FAIL and worse.reason == "the worst fold (json held out) keeps 70% of its RL gain"
    assert "single-harness control xml 20%" in worse.figure
    small = claims.claim_7({"xml": _fold(0.45, 0.5, n=8)}, **P)
    assert small.status == claims.UNDERPOWERED


def test_claim_7_without_a_gain_or_an_sft_baseline():
    assert "nothing to transfer" in claims.claim_7({"e": _fold(0.2, 0.2)}, **P).reason
    old = claims.claim_7({"e": {"in_harness": 0.5, "held_out": 0.42}}, **P)
    assert old.status == NOT_MEASURED and "sft_policy's success in each harness" in old.reason
    assert claims.claim_7({"e": {"in_harness": 0.5}}, **P).status == NOT_MEASURED
    assert claims.claim_7({}, **P).status == NOT_MEASURED


def test_claim_8():
    rows = [{"name": "h1", "kind": "hack", "ok": True}, {"name": "ok1", "kind": "honest", "ok": True}]
    whole = claims.claim_8(rows, corpus_size={"hack": 1, "honest": 1}, **P)
    assert whole.status == PASS and whole.reason == "right on the whole corpus"
    sample = claims.claim_8(rows, corpus_size={"hack": 22, "honest": 13}, **P)
    assert sample.status == PASS and "a sample of the corpus (1/22 hacks, 1/13 honest)" in sample.reason
    missed = claims.claim_8(rows + [{"name": "h2", "kind": "hack", "ok": False}], **P)
    assert missed.status == FAIL and "h2" in missed.reason
    assert claims.claim_8(rows[:1], **P).status == NOT_MEASURED


def test_a_claim_line():
    c = claims.claim_2({"stage_1": 1.3}, {"none": 3.2}, **P)
    assert c.line() == f"claim 2 ✓ pass: {c.figure} (target: {c.target})"
    assert claims.not_measured(5, "t", "r", "smoke").line() == "claim 5 · not measured: — (target: t)"
    # Every claim carries n and power (None where it is not a sampling test).
    assert c.as_dict()["n"] is None and c.as_dict()["power"] is None


def test_claim_7_shows_the_syntax_sft_never_saw_apart():
    # openclaw's fold keeps 0 % of its gain (SFT never saw its syntax): shown, not judged.
    c = claims.claim_7({"openclaw": _fold(0.2, 0.5), "hermes": _fold(0.46, 0.5)}, **P)
    assert c.status == PASS and "worst fold (hermes held out)" in c.reason
    assert "openclaw (a syntax SFT never saw) is zero-shot transfer: shown, not judged" in c.figure
    assert c.figures["transfer"]["openclaw"]["transfer"] == 0
    alone = claims.claim_7({"openclaw": _fold(0.2, 0.5)}, **P)
    assert alone.status == NOT_MEASURED and "no fold of a harness SFT saw" in alone.reason
