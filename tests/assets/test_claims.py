"""The claim verdicts (assets/claims.py) on hand-made figures: each claim passes, fails and is
"not measured" where it should, with the intervals computed by hand."""

import math

import pytest

from assets import claims
from assets.claims import DOMAINS, EFFORTS, FAIL, NOT_MEASURED, PASS

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


def _specialists(rate=0.6, n=100, tokens=(10, 20, 40), hard=(0.2, 0.3)):
    return {(d, e): {"success_rate": rate, "n": n, "mean_policy_tokens": tokens[i],
                     "hard": {"success_rate": hard[0] if e == "low" else hard[1], "n": 50}}
            for d in DOMAINS for i, e in enumerate(EFFORTS)}


SFT = {(d, e): {"success_rate": 0.3, "n": 100} for d in DOMAINS for e in EFFORTS}


def test_claim_3_passes():
    c = claims.claim_3(SFT, _specialists(), **P)
    assert c.status == PASS and c.figure.startswith("9/9 specialists beat SFT")
    assert c.figures["gains"]["coding_agents/max"]["gain"] == pytest.approx(0.3)


@pytest.mark.parametrize("spec, why", [
    (_specialists(rate=0.38), "gains +8 points"),                       # below +10
    (_specialists(rate=0.6, n=8), "gains +30 points"),                  # +30 but the interval reaches 0 at n = 8
    (_specialists(tokens=(20, 20, 40)), "tokens low/high/max 20/20/40 not increasing"),
    (_specialists(hard=(0.3, 0.2)), "hard max 0.20 < low 0.30"),
])
def test_claim_3_fails(spec, why):
    c = claims.claim_3({k: dict(v, n=spec[k]["n"]) for k, v in SFT.items()}, spec, **P)
    assert c.status == FAIL and why in c.reason


def test_claim_3_missing_parts():
    spec = _specialists()
    del spec[("general_tasks", "low")]
    c = claims.claim_3(SFT, spec, **P)
    assert c.status == FAIL and "general_tasks/low: specialist not measured" in c.reason
    assert claims.claim_3(SFT, {}, **P).status == NOT_MEASURED


def test_claim_4():
    teachers = {(d, e): 0.5 for d in DOMAINS for e in EFFORTS}
    assert claims.claim_4(teachers, {k: 0.46 for k in teachers}, **P).status == PASS
    low = dict.fromkeys(teachers, 0.5)
    low[("coding_agents", "max")] = 0.40
    c = claims.claim_4(teachers, low, **P)
    assert c.status == FAIL and "coding_agents/max keeps 80%" in c.reason
    zero = {**teachers, ("general_tasks", "low"): 0.0}
    assert "the teacher scores 0" in claims.claim_4(zero, {k: 0.5 for k in teachers}, **P).reason
    assert claims.claim_4(teachers, {}, **P).status == NOT_MEASURED


def test_claim_5():
    acc = {"metric": "success_rate", "higher_is_better": True, **P}
    assert claims.claim_5({"bf16": 0.60, "mxfp4": 0.58}, {"bf16": 0.60, "mxfp4": 0.50}, **acc).status == PASS
    c = claims.claim_5({"bf16": 0.60, "mxfp4": 0.55}, {"bf16": 0.60, "mxfp4": 0.52}, **acc)
    assert c.status == FAIL and "62% of PTQ's drop" in c.reason
    # A loss-like metric: the drop is the rise.
    ppl = {"metric": "ppl", "higher_is_better": False, **P}
    assert claims.claim_5({"bf16": 50.0, "mxfp4": 51.0}, {"bf16": 50.0, "mxfp4": 56.0}, **ppl).status == PASS
    nothing = claims.claim_5({"bf16": 50.0, "mxfp4": 50.0}, {"bf16": 50.0, "mxfp4": 49.0}, **ppl)
    assert nothing.status == FAIL and "PTQ loses nothing" in nothing.reason
    assert claims.claim_5({"bf16": 1.0}, {"bf16": 1.0, "mxfp4": 0.5}, **acc).status == NOT_MEASURED


def test_claim_6():
    assert claims.claim_6({1: 1.7, 2: 2.2, 4: 2.8}, 1.4, True, **P).status == PASS
    short = claims.claim_6({4: 2.1}, 1.4, True, **P)
    assert short.status == FAIL and "2.10 < 2.5" in short.reason
    assert "speculative output differs" in claims.claim_6({4: 3.0}, 1.4, False, **P).reason
    assert "no speedup" in claims.claim_6({4: 3.0}, 0.9, True, **P).reason
    assert claims.claim_6({4: 3.0}, None, True, **P).status == FAIL
    assert claims.claim_6({}, 1.4, True, **P).status == NOT_MEASURED


def test_claim_7():
    assert claims.claim_7({"e": {"in_harness": 0.5, "held_out": 0.42}}, **P).status == PASS
    c = claims.claim_7({"e": {"in_harness": 0.5, "held_out": 0.45}, "d": {"in_harness": 0.5, "held_out": 0.3}},
                       control={"e": 0.2}, **P)
    assert c.status == FAIL and c.reason == "the worst fold (d held out) keeps 60%"
    assert "single-harness control e 20%" in c.figure
    assert "no in-harness success" in claims.claim_7({"e": {"in_harness": 0.0, "held_out": 0.0}}, **P).reason
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
