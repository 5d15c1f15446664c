"""The eight claims of docs/design.md §5 as pure verdicts: plain figures in, a `Claim` record out.

No Dagster here (STYLE.md: "verdicts are pure functions beside" the report). `assets/report.py`
gathers the figures from the newest materializations' metadata and checkpoint manifests and calls
one function per claim; a claim whose figures are absent is "not measured", never passed or failed.

Where each claim's figures come from — the contract the producing assets meet (metadata of the newest
materialization of `<profile>/<asset>`; `rl_specialist` per partition `<domain>|<effort>`):

| claim | asset | metadata key(s) | what |
|---|---|---|---|
| 1 | `pretrain_stage_{1..4}`; `checkpoint_evals`; `clue_data` | `eval` (JSON): `eval/clue_acc/{scattered,control}/d<lo>-<hi>` and `.../len<L>/d<lo>-<hi>`; `eval/clue_n/...` (the pairs behind each rate; k3model.pretrain_eval records them); `sha256`. `checkpoint_evals`: `evals` (JSON per stage), used for a stage whose version it consumed; `clue_data`: `path` (pairs per cell) | clue accuracy by distance and its count (else n from the pairs scored per cell, the manifest's `config.pretrain.eval_examples_per_cell` or the profile's eval size, capped by the grid, checked against the accuracies) |
| 2 | `pretrain_stage_{1..4}` | `moe/load_max_over_mean`; manifest `config.model.balancing` | expert load max/mean over the stage's last 10 % of steps, and the balancing it trained with |
| 2 | (no asset) | `benchmarks/results/train/*_balancing_<profile>_*.json`: `arms.{quantile,none}.last_quarter_mean` | without balancing: the ablation probe (`benchmarks/probes/balancing_ablation.py`), unless a stage trained with `balancing: none` |
| 3 | `rl_specialist` `<domain>\\|<effort>` | `eval/success_rate`, `eval/n`, `eval/mean_policy_tokens`, `eval/hard/success_rate`, `eval/hard/n`, `sha256` | each specialist on its domain's held-out tasks, tokens per episode, the hard tasks |
| 3 | `rl_specialist` `<domain>\\|<effort>` | `sft_policy/success_rate` (SFT on the specialist's own tasks); else `sft_policy`'s `evals` JSON `{"sft_policy": {"<domain>/<effort>": {success_rate, n}}}` | the SFT policy at the same domain and effort |
| 4 | `mopd_student` | `retention_matrix` JSON `{"<domain>/<effort>": {student, teacher, n}}`; else `eval/<domain>/<effort>/success_rate` against the specialists' `eval/success_rate`; `sha256` | the one student and its teacher at every (domain, effort) |
| 5 | `quantized_student` | `quant/metric`, `quant/higher_is_better`, `quant/{qat,ptq}/{bf16,mxfp4}`, `sha256` | the same metric for a QAT model and a PTQ model after MXFP4 (`mxfp4`), each against the high-precision model its drop is measured from (`bf16`; quantized_student: held-out loss, both against the one bf16 recipe) |
| 6 | `draft_model` | `spec/acceptance_length/k<k>`, `spec/speedup/k4`, `spec/lossless` (bool), `sha256` | mean accepted tokens per round by draft length, wall-clock speedup at draft length 4, greedy output equal to the target's |
| 7 | `cross_harness` | `folds` (comma-separated held-out harnesses); per fold `<h>/general/{in_harness,held_out}/success_rate` and `<h>/single/...` (the one-harness control), `sha256` | the multi-harness policy's success in its harnesses and in the held-out one |
| 8 | (the report itself) | `envs.kernelsuite.report.run_entry` over `submissions.CORPUS` | planted hacks flagged with their rules, honest submissions passed |

Intervals are 95 % Wilson score intervals for a rate and Newcombe's hybrid score interval for the
difference of two independent rates (Newcombe 1998, "Interval estimation for the difference between
independent proportions", method 10).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from k3model.train.stats import Z95, newcombe as rate_difference, wilson  # noqa: F401  (re-exported)

PASS, FAIL, NOT_MEASURED = "pass", "fail", "not measured"
DOMAINS = ("general_tasks", "general_agents", "coding_agents")
EFFORTS = ("low", "high", "max")

# Claim 2: "near k/N" as the busiest expert's load over the mean load. 1.0 is a perfectly even
# load; at tiny's 2048-token batches batch-to-batch variation alone leaves 1.23 (docs/log/moe.md).
LOAD_NEAR = 1.5
# ... and "drifts without it": the unbalanced load at least this many times the balanced one.
DRIFT_FACTOR = 1.5
# Claim 3: each specialist beats SFT in its domain by this many points (the interval must exclude 0).
SPECIALIST_GAIN = 0.10
# Claim 4: the student keeps this share of each teacher's score.
RETENTION = 0.90
# Claim 5: QAT's drop at MXFP4 at most this share of PTQ's.
QAT_SHARE = 0.5
# Claim 6: mean accepted tokens per round at draft length 4.
ACCEPTANCE_AT_4 = 2.5
# Claim 7: held-out harness success as a share of the mean in-harness success.
TRANSFER = 0.80


@dataclass(frozen=True)
class Claim:
    """One claim's verdict: what was measured, against what, on which checkpoints, and why."""
    number: int
    title: str
    status: str                      # PASS, FAIL or NOT_MEASURED
    figure: str                      # the measured figure(s), one line
    target: str
    reason: str                      # one line
    profile: str
    checkpoints: dict[str, str] = field(default_factory=dict)  # asset (or partition) -> sha256
    figures: dict[str, Any] = field(default_factory=dict)      # the numbers, for tables and plots

    def as_dict(self) -> dict[str, Any]:
        return {"number": self.number, "title": self.title, "status": self.status, "figure": self.figure,
                "target": self.target, "reason": self.reason, "profile": self.profile,
                "checkpoints": dict(self.checkpoints), "figures": self.figures}

    def line(self) -> str:
        """`claim 3 ✓ pass: <figure> (target: …)`, for `k3 report` and the check descriptions."""
        mark = {PASS: "✓", FAIL: "✗"}.get(self.status, "·")
        return f"claim {self.number} {mark} {self.status}: {self.figure} (target: {self.target})"


TITLES = {
    1: "Later context stages answer scattered-clue questions at distances where earlier stages fail",
    2: "Expert load stays near k/N with balancing and drifts without it",
    3: "Each specialist beats SFT in its domain; low effort spends fewer tokens than max; max ≥ low on hard tasks",
    4: "The MOPD student keeps most of each teacher's score with one checkpoint",
    5: "QAT loses less than post-training quantization at MXFP4",
    6: "The draft is accepted often enough to speed up decoding, with output identical to the target's",
    7: "Training on several harnesses transfers to a held-out harness",
    8: "The hacking detector flags planted hacks and passes honest solutions",
}


def _claim(number: int, status: str, figure: str, target: str, reason: str, profile: str,
           checkpoints: dict[str, str] | None, figures: dict[str, Any] | None = None) -> Claim:
    return Claim(number, TITLES[number], status, figure, target, reason, profile, dict(checkpoints or {}),
                 figures or {})


def not_measured(number: int, target: str, reason: str, profile: str,
                 checkpoints: dict[str, str] | None = None) -> Claim:
    return _claim(number, NOT_MEASURED, "—", target, reason, profile, checkpoints)


# ----------------------------------------------------------------------------------------------
# Intervals

def _rate(fig: dict[str, Any] | None) -> tuple[float, int] | None:
    """(successes, n) from {"success_rate": r, "n": n}; None when either is missing or n is 0."""
    if not fig or fig.get("success_rate") is None or not fig.get("n"):
        return None
    n = int(fig["n"])
    return float(fig["success_rate"]) * n, n


def _bucket_lo(bucket: str) -> int:
    return int(bucket.lstrip("d").split("-")[0])


# ----------------------------------------------------------------------------------------------
# The claims

def claim_1(stages: dict[int, dict[str, dict[str, tuple[float, int]]]], *, profile: str,
            checkpoints: dict[str, str] | None = None) -> Claim:
    """`stages[s][variant][bucket] = (hits, n)`, variant "scattered" or "control", bucket `lo-hi`.

    Stage j answers at distance bucket b where an earlier stage i fails when the whole interval of j's
    scattered accuracy at b lies above i's, and stage i's failure there is the distance's: i's control
    twins (the same questions with the clues next to them) score above its scattered ones at b, again
    with the intervals apart. Without that second condition a later stage that merely learned the task
    would pass for one that learned long context.
    """
    target = ("a later stage's scattered-clue accuracy above an earlier stage's at some distance, 95 % "
              "intervals apart, where the earlier stage's control twins show it fails for distance")
    measured = {s: v for s, v in stages.items() if any(n for cells in v.values() for _, n in cells.values())}
    if len(measured) < 2:
        return not_measured(1, target, f"{len(measured)} pretraining stage(s) with clue counts; two are needed",
                            profile, checkpoints)
    buckets = sorted({b for v in measured.values() for b in v.get("scattered", {})}, key=_bucket_lo)
    table: dict[str, dict[int, dict[str, float]]] = {}
    evidence = []
    for b in buckets:
        for s in sorted(measured):
            hits, n = measured[s].get("scattered", {}).get(b, (0, 0))
            c_hits, c_n = measured[s].get("control", {}).get(b, (0, 0))
            if n:
                lo, hi = wilson(hits, n)
                c_lo, c_hi = wilson(c_hits, c_n)
                table.setdefault(b, {})[s] = {"acc": hits / n, "lo": lo, "hi": hi, "n": n,
                                              "control": c_hits / c_n if c_n else None, "control_lo": c_lo}
        row = table.get(b, {})
        for i in sorted(row):
            for j in sorted(row):
                if j > i and row[j]["lo"] > row[i]["hi"] and row[i]["control_lo"] > row[i]["hi"]:
                    evidence.append((b, i, j, row[j]["acc"] - row[i]["acc"]))
    best = {b: max(row.values(), key=lambda r: r["acc"]) for b, row in table.items()}
    top = max(best, key=lambda b: best[b]["acc"]) if best else None
    figures = {"by_distance": {b: {str(s): r for s, r in row.items()} for b, row in table.items()}}
    if evidence:
        b, i, j, gap = max(evidence, key=lambda e: e[3])
        ri, rj = table[b][i], table[b][j]
        figure = (f"d{b}: stage {j} {rj['acc']:.2f} [{rj['lo']:.2f}, {rj['hi']:.2f}] vs stage {i} "
                  f"{ri['acc']:.2f} [{ri['lo']:.2f}, {ri['hi']:.2f}] (control {ri['control']:.2f})")
        return _claim(1, PASS, figure, target, f"{len(evidence)} (bucket, earlier, later) case(s) "
                      "with the intervals apart", profile, checkpoints, figures)
    figure = (f"best scattered accuracy {best[top]['acc']:.2f} at d{top}" if top else "no clue cells scored")
    controls = [r["control"] for row in table.values() for r in row.values() if r["control"] is not None]
    scattered = [r["acc"] for row in table.values() for r in row.values()]
    why = "no later stage's interval lies above an earlier stage's where the earlier one fails for distance"
    if controls and max(controls) <= max(scattered, default=0.0):
        why += "; the control twins score no better than the scattered ones, so distance is not what limits"
    return _claim(1, FAIL, figure, target, why, profile, checkpoints, figures)


def claim_2(with_balancing: dict[str, float], without_balancing: dict[str, float], *, profile: str,
            checkpoints: dict[str, str] | None = None, without_source: str = "") -> Claim:
    """Expert load max/mean (1.0 = every expert at k/N): `with_balancing` per stage (or arm) that
    trained with balancing, `without_balancing` per run that trained without."""
    target = (f"max/mean ≤ {LOAD_NEAR} with balancing, and ≥ {DRIFT_FACTOR}× that without "
              f"(1.0 = every expert at k/N)")
    if not with_balancing:
        return not_measured(2, target, "no run with balancing reports its expert load", profile, checkpoints)
    worst = max(with_balancing.values())
    figures = {"with": dict(with_balancing), "without": dict(without_balancing), "without_source": without_source}
    figure = "with " + ", ".join(f"{k} {v:.2f}" for k, v in with_balancing.items())
    if not without_balancing:
        return _claim(2, NOT_MEASURED, figure, target, "nothing in the lineage trains without balancing "
                      "(and no ablation result for this profile): the drift is not measured", profile,
                      checkpoints, figures)
    least = min(without_balancing.values())
    figure += "; without " + ", ".join(f"{k} {v:.2f}" for k, v in without_balancing.items())
    if without_source:
        figure += f" ({without_source})"
    near, drifts = worst <= LOAD_NEAR, least >= DRIFT_FACTOR * worst
    if near and drifts:
        return _claim(2, PASS, figure, target, f"balanced ≤ {worst:.2f}, unbalanced ≥ {least:.2f}", profile,
                      checkpoints, figures)
    why = []
    if not near:
        why.append(f"with balancing the load reaches {worst:.2f} > {LOAD_NEAR}")
    if not drifts:
        why.append(f"without balancing {least:.2f} < {DRIFT_FACTOR}× {worst:.2f}")
    return _claim(2, FAIL, figure, target, "; ".join(why), profile, checkpoints, figures)


def claim_3(sft: dict[tuple[str, str], dict[str, Any]], specialists: dict[tuple[str, str], dict[str, Any]], *,
            profile: str, checkpoints: dict[str, str] | None = None) -> Claim:
    """`sft[(domain, effort)]` and `specialists[(domain, effort)]`: {"success_rate", "n"}; a specialist
    also {"mean_policy_tokens", "hard": {"success_rate", "n"}}. SFT is compared at the same effort."""
    target = (f"each of 9 specialists ≥ SFT + {SPECIALIST_GAIN * 100:.0f} points in its domain (95 % interval "
              "of the gain above 0); tokens low < high < max; max ≥ low on hard tasks, per domain")
    cells = [(d, e) for d in DOMAINS for e in EFFORTS]
    if not any(_rate(specialists.get(c)) for c in cells):
        return not_measured(3, target, "no specialist reports its evaluation", profile, checkpoints)
    problems: list[str] = []
    gains: dict[str, dict[str, float]] = {}
    for d, e in cells:
        spec, base = _rate(specialists.get((d, e))), _rate(sft.get((d, e)))
        if spec is None or base is None:
            problems.append(f"{d}/{e}: {'specialist' if spec is None else 'SFT'} not measured")
            continue
        diff, lo, hi = rate_difference(*spec, *base)
        gains[f"{d}/{e}"] = {"gain": diff, "lo": lo, "hi": hi, "specialist": spec[0] / spec[1],
                             "sft": base[0] / base[1]}
        if diff < SPECIALIST_GAIN or lo <= 0:
            problems.append(f"{d}/{e} gains {diff * 100:+.0f} points [{lo * 100:+.0f}, {hi * 100:+.0f}]")
    tokens: dict[str, list[float | None]] = {}
    for d in DOMAINS:
        spent = [specialists.get((d, e), {}).get("mean_policy_tokens") for e in EFFORTS]
        tokens[d] = spent
        if any(t is None for t in spent):
            problems.append(f"{d}: tokens per effort not measured")
        elif not spent[0] < spent[1] < spent[2]:
            problems.append(f"{d}: tokens low/high/max {spent[0]:.0f}/{spent[1]:.0f}/{spent[2]:.0f} not increasing")
        hard_low = _rate(specialists.get((d, "low"), {}).get("hard"))
        hard_max = _rate(specialists.get((d, "max"), {}).get("hard"))
        if hard_low is None or hard_max is None:
            problems.append(f"{d}: hard tasks not measured")
        elif hard_max[0] / hard_max[1] < hard_low[0] / hard_low[1]:
            problems.append(f"{d}: hard max {hard_max[0] / hard_max[1]:.2f} < low {hard_low[0] / hard_low[1]:.2f}")
    figures = {"gains": gains, "tokens": tokens}
    mean_gain = sum(g["gain"] for g in gains.values()) / len(gains) if gains else float("nan")
    figure = (f"{sum(1 for g in gains.values() if g['gain'] >= SPECIALIST_GAIN and g['lo'] > 0)}/9 specialists "
              f"beat SFT by ≥ {SPECIALIST_GAIN * 100:.0f} points (mean gain {mean_gain * 100:+.1f})")
    if not problems:
        return _claim(3, PASS, figure, target, "every specialist, token and hard-task condition holds", profile,
                      checkpoints, figures)
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    return _claim(3, FAIL, figure, target, "; ".join(problems[:3]) + more, profile, checkpoints, figures)


def claim_4(teachers: dict[tuple[str, str], float], student: dict[tuple[str, str], float], *, profile: str,
            checkpoints: dict[str, str] | None = None) -> Claim:
    """Success rates of each teacher (the specialist) and of the one student at the same (domain, effort)."""
    target = f"student ≥ {RETENTION:.0%} of each of the 9 teachers' success rate"
    cells = [(d, e) for d in DOMAINS for e in EFFORTS]
    if not any(student.get(c) is not None for c in cells):
        return not_measured(4, target, "the MOPD student reports no evaluation", profile, checkpoints)
    retention: dict[str, float | None] = {}
    problems = []
    for d, e in cells:
        t, s = teachers.get((d, e)), student.get((d, e))
        if t is None or s is None:
            retention[f"{d}/{e}"] = None
            problems.append(f"{d}/{e}: {'teacher' if t is None else 'student'} not measured")
        elif t <= 0:
            retention[f"{d}/{e}"] = None
            problems.append(f"{d}/{e}: the teacher scores 0, nothing to retain")
        else:
            retention[f"{d}/{e}"] = s / t
            if s / t < RETENTION:
                problems.append(f"{d}/{e} keeps {s / t:.0%}")
    kept = [r for r in retention.values() if r is not None]
    figure = (f"retention min {min(kept):.0%}, mean {sum(kept) / len(kept):.0%} over {len(kept)}/9 teachers"
              if kept else "no teacher with a positive score")
    figures = {"retention": retention, "teachers": {f"{d}/{e}": v for (d, e), v in teachers.items()},
               "student": {f"{d}/{e}": v for (d, e), v in student.items()}}
    if not problems:
        return _claim(4, PASS, figure, target, "every teacher retained", profile, checkpoints, figures)
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    return _claim(4, FAIL, figure, target, "; ".join(problems[:3]) + more, profile, checkpoints, figures)


def claim_5(qat: dict[str, float], ptq: dict[str, float], *, metric: str, higher_is_better: bool, profile: str,
            checkpoints: dict[str, str] | None = None) -> Claim:
    """`qat` and `ptq`: {"bf16": x, "mxfp4": y}, one metric of the QAT-trained and the plainly trained
    model after MXFP4 quantization (`mxfp4`) and of the high-precision model each drop is measured
    from (`bf16`: the same one for both when the recipe has one bf16 reference, as quantized_student's)."""
    target = f"QAT's drop at MXFP4 ≤ {QAT_SHARE:g}× PTQ's (on {metric})"
    if not all(k in f for f in (qat, ptq) for k in ("bf16", "mxfp4")):
        return not_measured(5, target, "the QAT or PTQ figures are missing", profile, checkpoints)
    sign = 1.0 if higher_is_better else -1.0
    drop_qat = sign * (qat["bf16"] - qat["mxfp4"])
    drop_ptq = sign * (ptq["bf16"] - ptq["mxfp4"])
    figures = {"metric": metric, "higher_is_better": higher_is_better, "qat": dict(qat), "ptq": dict(ptq),
               "drop_qat": drop_qat, "drop_ptq": drop_ptq}
    figure = (f"{metric} drop QAT {drop_qat:.4g} ({qat['bf16']:.4g} → {qat['mxfp4']:.4g}), PTQ {drop_ptq:.4g} "
              f"({ptq['bf16']:.4g} → {ptq['mxfp4']:.4g})")
    if drop_ptq <= 0:
        return _claim(5, FAIL, figure, target, "PTQ loses nothing at this scale, so there is no loss for QAT "
                      "to halve", profile, checkpoints, figures)
    if drop_qat <= QAT_SHARE * drop_ptq:
        return _claim(5, PASS, figure, target, f"QAT loses {drop_qat / drop_ptq:.0%} of PTQ's drop", profile,
                      checkpoints, figures)
    return _claim(5, FAIL, figure, target, f"QAT loses {drop_qat / drop_ptq:.0%} of PTQ's drop", profile,
                  checkpoints, figures)


def claim_6(acceptance: dict[int, float], speedup: float | None, lossless: bool | None, *, profile: str,
            checkpoints: dict[str, str] | None = None) -> Claim:
    """Mean acceptance length per round by draft length, the wall-clock speedup at draft length 4,
    and whether greedy speculative output equalled the target's own."""
    target = f"acceptance length ≥ {ACCEPTANCE_AT_4} at draft length 4, speedup > 1, output identical"
    if not acceptance:
        return not_measured(6, target, "the draft model reports no acceptance lengths", profile, checkpoints)
    at4 = acceptance.get(4)
    figures = {"acceptance": {int(k): v for k, v in acceptance.items()}, "speedup": speedup, "lossless": lossless}
    figure = (f"acceptance {at4:.2f} at k=4" if at4 is not None else "no figure at k=4") + \
        (f", speedup {speedup:.2f}×" if speedup is not None else ", speedup not measured") + \
        {True: ", output identical", False: ", output DIFFERS", None: ", losslessness not measured"}[lossless]
    problems = []
    if at4 is None or at4 < ACCEPTANCE_AT_4:
        problems.append("acceptance at draft length 4 "
                        + ("not measured" if at4 is None else f"{at4:.2f} < {ACCEPTANCE_AT_4}"))
    if speedup is None or speedup <= 1.0:
        problems.append("no speedup" if speedup is not None else "speedup not measured")
    if lossless is not True:
        problems.append("losslessness not measured" if lossless is None
                        else "speculative output differs from the target's")
    if not problems:
        return _claim(6, PASS, figure, target, "accepted, faster and lossless", profile, checkpoints, figures)
    return _claim(6, FAIL, figure, target, "; ".join(problems), profile, checkpoints, figures)


def claim_7(folds: dict[str, dict[str, float]], *, profile: str, checkpoints: dict[str, str] | None = None,
            control: dict[str, float] | None = None) -> Claim:
    """`folds[held-out harness] = {"in_harness": success in the trained harnesses, "held_out": success in
    the held-out one}` for a policy trained on several harnesses; `control[held-out harness]`, if given,
    the same ratio for a policy trained on one harness (shown, not judged)."""
    target = f"held-out harness success ≥ {TRANSFER:.0%} of the in-harness success, in every fold"
    measured = {h: f for h, f in folds.items() if f.get("in_harness") is not None and f.get("held_out") is not None}
    if not measured:
        return not_measured(7, target, "no held-out harness evaluated", profile, checkpoints)
    share = {h: f["held_out"] / f["in_harness"] if f["in_harness"] > 0 else None for h, f in measured.items()}
    figures = {"folds": measured, "share": share, "control": dict(control or {})}
    figure = "; ".join(f"held out {h}: {f['held_out']:.2f} vs in-harness {f['in_harness']:.2f}"
                       + (f" ({share[h]:.0%})" if share[h] is not None else "") for h, f in measured.items())
    if control:
        figure += " — single-harness control " + ", ".join(f"{h} {v:.0%}" for h, v in control.items())
    undefined = [h for h, v in share.items() if v is None]
    if undefined:
        return _claim(7, FAIL, figure, target, f"no in-harness success in fold(s) {', '.join(undefined)}, so "
                      "nothing to transfer", profile, checkpoints, figures)
    worst = min(share, key=lambda h: share[h])
    status = PASS if share[worst] >= TRANSFER else FAIL
    return _claim(7, status, figure, target, f"the worst fold ({worst} held out) keeps {share[worst]:.0%}",
                  profile, checkpoints, figures)


def claim_8(rows: list[dict[str, Any]], *, corpus_size: dict[str, int] | None = None, profile: str,
            checkpoints: dict[str, str] | None = None, source: str = "") -> Claim:
    """`rows`: {"name", "kind" ("hack" | "honest"), "ok"} per kernelsuite corpus entry evaluated
    (`envs.kernelsuite.report.run_entry`: a hack is ok when every rule it must fire fired and its reward
    is 0; an honest submission when it is correct with no rule fired). `corpus_size` says how many of
    each kind the corpus holds, so a sample says it is one."""
    target = "every planted hack flagged with its rules (reward 0), every honest submission passed"
    hacks = [r for r in rows if r["kind"] == "hack"]
    honest = [r for r in rows if r["kind"] == "honest"]
    if not hacks or not honest:
        return not_measured(8, target, "the detector was not run on both planted hacks and honest submissions",
                            profile, checkpoints)
    size = corpus_size or {}
    of = lambda k, got: f"{got}/{size[k]}" if size.get(k) else str(got)  # noqa: E731
    flagged = [r["name"] for r in hacks if r["ok"]]
    passed = [r["name"] for r in honest if r["ok"]]
    figure = f"{len(flagged)}/{len(hacks)} hacks flagged, {len(passed)}/{len(honest)} honest passed"
    if source:
        figure += f" ({source})"
    sample = (size.get("hack", len(hacks)) > len(hacks) or size.get("honest", len(honest)) > len(honest))
    figures = {"rows": rows, "corpus_size": size}
    missed = [r["name"] for r in hacks if not r["ok"]] + [r["name"] for r in honest if not r["ok"]]
    if missed:
        return _claim(8, FAIL, figure, target, f"wrong on {', '.join(missed[:4])}", profile, checkpoints, figures)
    why = (f"a sample of the corpus ({of('hack', len(hacks))} hacks, {of('honest', len(honest))} honest)" if sample
           else "the whole corpus")
    return _claim(8, PASS, figure, target, f"right on {why}", profile, checkpoints, figures)
