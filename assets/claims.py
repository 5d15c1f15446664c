"""The eight claims of docs/design.md §5 as pure verdicts: plain figures in, a `Claim` record out.

No Dagster here (STYLE.md: "verdicts are pure functions beside" the report). `assets/report.py`
gathers the figures from the newest materializations' metadata and checkpoint manifests and calls
one function per claim; a claim whose figures are absent is "not measured", never passed or failed.

Where each claim's figures come from — the contract the producing assets meet (metadata of the newest
materialization of `<profile>/<asset>`; `rl_specialist` per partition `<domain>|<effort>`):

| claim | asset | metadata key(s) | what |
|---|---|---|---|
| 1 | `pretrain_stage_{1..4}`; `checkpoint_evals`; `clue_data` | `eval` (JSON): `eval/clue_acc/{scattered,control}/d<lo>-<hi>` and `.../len<L>/d<lo>-<hi>`; `eval/clue_n/...` (the pairs behind each rate; k3model.train.pretrain_eval records them); `sha256`. `checkpoint_evals`: `evals` (JSON per stage), used for a stage whose version it consumed; `clue_data`: `path` (pairs per cell) | clue accuracy by distance and its count (else n from the pairs scored per cell, the manifest's `config.pretrain.eval_examples_per_cell` or the profile's eval size, capped by the grid, checked against the accuracies) |
| 2 | `pretrain_stage_{1..4}` | `moe/heldout_load_max_over_mean[_bias_zeroed]`, `moe/heldout_dead_fraction`, `moe/heldout_per_batch_{sd,max}`, `moe/heldout_tokens`; else `moe/load_max_over_mean`; manifest `config.model.balancing` | the final checkpoint's expert load over the fixed held-out mixed set, with its bias and with it zeroed (else the last 10 % of steps), and the balancing it trained with |
| 2 | `balancing_ablation` | `balanced`, `steps`, `<arm>/moe/heldout_load_max_over_mean`, `<arm>/moe/heldout_dead_fraction`, `<arm>/moe/heldout_per_batch_{sd,max}`, `<arm>/moe/heldout_tokens` (arm: the balanced one and `none`), `load_curves` | without balancing: a short stage-1 run trained with `balancing: none`, judged against its balanced twin at the same steps (unless a stage trained with `none`) |
| 2 | (no asset) | `benchmarks/results/train/*_balancing_<profile>_*.json`: `arms.{quantile,none}.last_quarter_mean` | without balancing, where neither of the above exists: the ablation probe (`probes-archive:benchmarks/probes/balancing_ablation.py`) |
| 3 | `rl_specialist` `<domain>\\|<effort>` | `eval/success_rate`, `eval/n`, `eval/mean_policy_tokens`, `eval/hard/success_rate`, `eval/hard/n`, `paired/{b,c,n}`, optional `eval/greedy/{success_rate,n}`, `eval/pass_at_8`, `sha256` | each specialist on its domain's held-out tasks, paired with sft_policy on the same tasks and seeds, tokens per episode, the hard tasks |
| 3 | `rl_specialist` `<domain>\\|<effort>` | `sft_policy/success_rate`, `sft_policy/n` (SFT on the specialist's own tasks), at low `sft_policy/hard/{success_rate,n}`; else `sft_policy`'s `evals` JSON `{"sft_policy": {"<domain>/<effort>": {success_rate, n}}}` | the SFT policy at the same domain and effort |
| 4 | `mopd_student` | `retention_matrix` JSON `{"<domain>/<effort>": {student, teacher, n[, sft]}}` (a student of a subset of the routes has only those cells: the others are "not distilled", never failures); else `eval/<domain>/<effort>/success_rate` against the specialists' `eval/success_rate`; SFT and the teacher-vs-SFT pairs from claim 3's figures; `sha256` | the one student, its teacher and sft_policy at every (domain, effort) |
| 5 | `quantized_student` | `quant/metric`, `quant/higher_is_better`, `quant/{qat,ptq}/{bf16,mxfp4}` (means over seeds), `quant/seed_drops` (JSON `{"qat": [...], "ptq": [...]}`), `quant/n` (held-out windows), `quant/scope`, `sha256` | the same metric for a QAT model and a PTQ model after MXFP4 (`mxfp4`), each against the high-precision model its drop is measured from (`bf16`; quantized_student: held-out window NLL at the "all_linear" scope, each seed against its own bf16 arm) |
| 6 | `draft_model` | `spec/acceptance_length/k<k>`, `spec/speedup/k4`, `spec/lossless` (bool), `sha256` | τ = 1 + accepted / rounds (tokens per drafting round) by draft length, on chat-formatted held-out task prompts, against the served target (quantized_student's MXFP4 export); wall-clock speedup at draft length 4; greedy output equal to that target's |
| 7 | `cross_harness` | `folds` (comma-separated held-out harnesses); per fold `<h>/general/{in_harness,held_out}/{success_rate,n}`, `<h>/sft/{in_harness,held_out}/success_rate` and `<h>/single/...` (the one-harness control), `sha256` | the multi-harness policy's and sft_policy's success in its harnesses and in the held-out one: the RL gain in each |
| 8 | (the report itself) | `envs.kernelsuite.report.run_entry` over `submissions.CORPUS` | planted hacks flagged with their rules, honest submissions passed |

The statistics are `k3model.train.stats`'s (its docstring gives the formulas and sources): 95 % Wilson
intervals of a rate, Newcombe's interval of a difference of independent rates, the exact McNemar
test and the Agresti–Min interval of a paired difference, Holm across cells, delta-method intervals
of a ratio of gains, and power.

Power (issue 40 item 5, issue 41 items 1–2). Every claim carries `n` (per cell: the smallest cell's
count) and `power` (None where the claim is not a sampling test). A claim whose power at its
pre-registered effect is below `stats.POWER_TARGET` (0.8) reads "underpowered", never pass or fail:
its figures are shown, not judged (`_claim` applies the rule). The effects:
- claim 3: a true gain of +15 points over sft_policy in every cell (power of each cell's paired
  rule, from sft_policy's measured rate and n, at Holm's strictest level α/9). The claim says *each*
  specialist beats SFT, so its `power` is the chance that all nine pass at that effect (the product of
  the cells' powers, `figures["power_all"]`); each cell's power is shown beside its gain;
- claim 4: a student identical to its teachers (retains 100 % of each judged teacher's gain);
- claim 7: perfect transfer of the RL gain (held-out gain = in-harness gain) in every fold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from k3model.train import stats
from datagen.sft import HELD_OUT_HARNESS
from k3model.train.effort import DOMAINS, EFFORTS
from k3model.train.pretrain_eval import clue_distance_cases
from k3model.train.stats import Z95, newcombe as rate_difference, wilson  # noqa: F401  (re-exported)

PASS, FAIL, NOT_MEASURED, UNDERPOWERED = "pass", "fail", "not measured", "underpowered"

# Claim 2: "near k/N" as the busiest expert's load over the mean load. 1.0 is a perfectly even
# load; at tiny's 2048-token batches batch-to-batch variation alone leaves 1.23 (docs/log/moe.md).
LOAD_NEAR = 1.5
# ... and "drifts without it": the unbalanced load at least this many times the balanced one.
DRIFT_FACTOR = 1.5
# Claim 3: each specialist beats SFT in its domain by this many points (the paired interval must
# exclude 0, McNemar Holm-corrected across the nine at ALPHA), judged when each test has power ≥ 0.8
# at a true gain of POWERED_GAIN; the hard split is judged where sft_policy at low scores < HARD_BELOW.
SPECIALIST_GAIN = 0.10
POWERED_GAIN = 0.15
ALPHA = 0.05
HARD_BELOW = 0.5
# Claim 4: the student keeps this share of the teachers' pooled gain over SFT, with the 95 % lower
# bound at least RETENTION_LOWER, on the cells where the teacher beats SFT.
RETENTION = 0.90
RETENTION_LOWER = 0.70
# Claim 5: QAT's drop at MXFP4 at most this share of PTQ's.
QAT_SHARE = 0.5
# ... judged only where PTQ measurably hurts: its mean drop at least MIN_PTQ_DROP (nats on a held-out
# NLL) and at least SEED_SPREAD_FACTOR times the spread of its drops over two seeds (issue 41 item 3).
MIN_PTQ_DROP = 0.01
SEED_SPREAD_FACTOR = 5.0
# Claim 6: mean accepted tokens per round at draft length 4.
ACCEPTANCE_AT_4 = 2.5
# Claim 7: the RL gain in the held-out harness as a share of the gain in the trained harnesses.
TRANSFER = 0.80


@dataclass(frozen=True)
class Claim:
    """One claim's verdict: what was measured, against what, on which checkpoints, and why."""
    number: int
    title: str
    status: str                      # PASS, FAIL, NOT_MEASURED or UNDERPOWERED
    figure: str                      # the measured figure(s), one line
    target: str
    reason: str                      # one line
    profile: str
    checkpoints: dict[str, str] = field(default_factory=dict)  # asset (or partition) -> sha256
    figures: dict[str, Any] = field(default_factory=dict)      # the numbers, for tables and plots
    n: int | None = None             # per cell (the smallest cell's), None when not a sampling test
    power: float | None = None       # at the pre-registered effect (module docstring); None: not applicable

    def as_dict(self) -> dict[str, Any]:
        return {"number": self.number, "title": self.title, "status": self.status, "figure": self.figure,
                "target": self.target, "reason": self.reason, "profile": self.profile,
                "checkpoints": dict(self.checkpoints), "figures": self.figures, "n": self.n, "power": self.power}

    def line(self) -> str:
        """`claim 3 ✓ pass: <figure> (target: …)`, for `k3 report` and the check descriptions."""
        mark = {PASS: "✓", FAIL: "✗", UNDERPOWERED: "~"}.get(self.status, "·")
        power = f"; n {self.n}, power {self.power:.2f}" if self.power is not None else ""
        return f"claim {self.number} {mark} {self.status}: {self.figure} (target: {self.target}{power})"


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
           checkpoints: dict[str, str] | None, figures: dict[str, Any] | None = None, *, n: int | None = None,
           power: float | None = None, effect: str = "") -> Claim:
    """The record, with the common rule: a pass or fail whose power is below the target is
    "underpowered" — the figures stay, the verdict does not."""
    if power is not None and power < stats.POWER_TARGET and status in (PASS, FAIL):
        reason = (f"power {power:.2f} < {stats.POWER_TARGET:.2f} at {effect or 'the pre-registered effect'} "
                  f"with n = {n} per cell: shown, not judged (the rule alone reads {status}: {reason})")
        status = UNDERPOWERED
    return Claim(number, TITLES[number], status, figure, target, reason, profile, dict(checkpoints or {}),
                 figures or {}, n, power)


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


# ----------------------------------------------------------------------------------------------
# The claims

def claim_1(stages: dict[int, dict[str, dict[str, tuple[float, int]]]], *, profile: str,
            checkpoints: dict[str, str] | None = None) -> Claim:
    """`stages[s][variant][bucket] = (hits, n)`, variant "scattered" or "control", bucket `lo-hi`;
    the test is `k3model.train.pretrain_eval.clue_distance_cases` (its docstring): pass when a case
    exists."""
    target = ("a later stage's scattered-clue accuracy above an earlier stage's at some distance, 95 % "
              "intervals apart, where the earlier stage's control twins show it fails for distance")
    measured = {s: v for s, v in stages.items() if any(n for cells in v.values() for _, n in cells.values())}
    if len(measured) < 2:
        return not_measured(1, target, f"{len(measured)} pretraining stage(s) with clue counts; two are needed",
                            profile, checkpoints)
    table, evidence = clue_distance_cases(measured)
    best = {b: max(row.values(), key=lambda r: r["acc"]) for b, row in table.items()}
    top = max(best, key=lambda b: best[b]["acc"]) if best else None
    figures = {"by_distance": {b: {str(s): r for s, r in row.items()} for b, row in table.items()}}
    n_min = min((r["n"] for row in table.values() for r in row.values()), default=None)
    if evidence:
        b, i, j, gap = max(evidence, key=lambda e: e[3])
        ri, rj = table[b][i], table[b][j]
        figure = (f"d{b}: stage {j} {rj['acc']:.2f} [{rj['lo']:.2f}, {rj['hi']:.2f}] vs stage {i} "
                  f"{ri['acc']:.2f} [{ri['lo']:.2f}, {ri['hi']:.2f}] (control {ri['control']:.2f})")
        return _claim(1, PASS, figure, target, f"{len(evidence)} (bucket, earlier, later) case(s) "
                      "with the intervals apart", profile, checkpoints, figures, n=n_min)
    figure = (f"best scattered accuracy {best[top]['acc']:.2f} at d{top}" if top else "no clue cells scored")
    controls = [r["control"] for row in table.values() for r in row.values() if r["control"] is not None]
    scattered = [r["acc"] for row in table.values() for r in row.values()]
    why = "no later stage's interval lies above an earlier stage's where the earlier one fails for distance"
    if controls and max(controls) <= max(scattered, default=0.0):
        why += "; the control twins score no better than the scattered ones, so distance is not what limits"
    return _claim(1, FAIL, figure, target, why, profile, checkpoints, figures, n=n_min)


def claim_2(with_balancing: dict[str, float], without_balancing: dict[str, float], *, profile: str,
            checkpoints: dict[str, str] | None = None, without_source: str = "", basis: str = "",
            dead: dict[str, float] | None = None, spread: dict[str, dict[str, float]] | None = None,
            drift_against: dict[str, str] | None = None) -> Claim:
    """Expert load max/mean (1.0 = every expert at k/N): `with_balancing` per stage (or arm) that
    trained with balancing, `without_balancing` per run that trained without (or, as
    `without_source` says, the same checkpoints with their routing bias zeroed). `basis` says what the
    figures are (a held-out set of N tokens, or training steps); `dead` the fraction of experts under
    10 % of k/N and `spread` the per-batch {"sd", "max"} of each arm, shown beside the verdict (the
    thresholds judge max/mean only, as DESIGN.md §5 fixes them).

    "Near": every `with_balancing` figure ≤ LOAD_NEAR. "Drifts": each `without_balancing` figure ≥
    DRIFT_FACTOR × the `with_balancing` figure `drift_against` names for it (its balanced twin at equal
    steps: an unbalanced arm trained for a few steps is not compared with a stage trained for
    thousands), else × the worst `with_balancing` figure."""
    target = (f"max/mean ≤ {LOAD_NEAR} with balancing, and ≥ {DRIFT_FACTOR}× that without "
              f"(1.0 = every expert at k/N)")
    if not with_balancing:
        return not_measured(2, target, "no run with balancing reports its expert load", profile, checkpoints)
    worst = max(with_balancing.values())
    figures = {"with": dict(with_balancing), "without": dict(without_balancing), "without_source": without_source,
               "basis": basis, "dead_fraction": dict(dead or {}), "per_batch": dict(spread or {})}
    figure = "with " + ", ".join(f"{k} {v:.2f}" for k, v in with_balancing.items())
    notes = []
    if basis:
        notes.append(basis)
    if spread:
        notes.append("per-batch sd/max " + ", ".join(f"{k} {v['sd']:.2f}/{v['max']:.2f}" for k, v in spread.items()))
    if dead:
        notes.append("dead experts " + ", ".join(f"{k} {v:.0%}" for k, v in dead.items()))
    if notes:
        figure += f" ({'; '.join(notes)})"
    if not without_balancing:
        return _claim(2, NOT_MEASURED, figure, target, "nothing in the lineage trains without balancing "
                      "(and no ablation result for this profile): the drift is not measured", profile,
                      checkpoints, figures)
    against = dict(drift_against or {})
    unknown = {k: v for k, v in against.items() if k not in without_balancing or v not in with_balancing}
    if unknown:
        raise ValueError(f"drift_against pairs a without_balancing run with a with_balancing one; {unknown} "
                         f"names one that is not there (without: {list(without_balancing)}, with: "
                         f"{list(with_balancing)})")
    # (unbalanced figure, the balanced figure it must exceed DRIFT_FACTOR times, that figure's name)
    pairs = {k: (v, with_balancing[against[k]] if k in against else worst, against.get(k, "the worst balanced"))
             for k, v in without_balancing.items()}
    figures["drift_against"] = {k: name for k, (_, _, name) in pairs.items()}
    figure += "; without " + ", ".join(f"{k} {v:.2f}" for k, v in without_balancing.items())
    if without_source:
        figure += f" ({without_source})"
    short = {k: p for k, p in pairs.items() if p[0] < DRIFT_FACTOR * p[1]}
    near, drifts = worst <= LOAD_NEAR, not short
    if near and drifts:
        least = min(v / ref for v, ref, _ in pairs.values())
        return _claim(2, PASS, figure, target, f"balanced ≤ {worst:.2f}, unbalanced ≥ {least:.2f}× its balanced "
                      "reference", profile, checkpoints, figures)
    why = []
    if not near:
        why.append(f"with balancing the load reaches {worst:.2f} > {LOAD_NEAR}")
    for k, (v, ref, name) in short.items():
        why.append(f"without balancing {k} {v:.2f} < {DRIFT_FACTOR}× {ref:.2f} ({name})")
    return _claim(2, FAIL, figure, target, "; ".join(why), profile, checkpoints, figures)


def _paired(fig: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """(b, c, n) from {"b", "c", "n"}: tasks only the new policy solved, only the baseline did, all."""
    if not fig or any(fig.get(k) is None for k in ("b", "c", "n")):
        return None
    return int(fig["b"]), int(fig["c"]), int(fig["n"])


def claim_3_power(sft_rate: float, n: int, cells: int = 9) -> float:
    """Power of one cell's paired rule (gain ≥ SPECIALIST_GAIN, McNemar at ALPHA/cells, Agresti–Min
    lower bound > 0) at a true gain of POWERED_GAIN (capped at 1 − sft_rate) over sft_policy's rate."""
    effect = min(POWERED_GAIN, 1.0 - sft_rate)
    if effect <= SPECIALIST_GAIN:
        return 0.0
    return stats.paired_power(sft_rate, effect, n, min_gain=SPECIALIST_GAIN, alpha=ALPHA / cells)


def require_claim_3_n(sft_rate: float, n: int, cells: int = 9) -> float:
    """Refuse (ValueError with the numbers and the n that would do) a held-out n per cell whose claim-3
    power at a true +POWERED_GAIN over sft_policy's measured `sft_rate` is below 0.8 for all `cells`
    together (each cell at 0.8^(1/cells)); else the cell's power.
    For a profile that pre-registers claim 3 as judged (a CPU profile that only shows it passes no n
    here and reads "underpowered")."""
    effect = min(POWERED_GAIN, 1.0 - sft_rate)
    if effect <= SPECIALIST_GAIN:
        raise ValueError(f"claim 3: sft_policy already scores {sft_rate:.2f}, so a gain of "
                         f"{SPECIALIST_GAIN * 100:.0f} points has no room; choose harder held-out tasks")
    # The claim needs all `cells` to pass: each cell at POWER_TARGET^(1/cells) gives the claim POWER_TARGET.
    return stats.require_paired_n(n, sft_rate, effect, min_gain=SPECIALIST_GAIN, alpha=ALPHA / cells,
                                  target=stats.POWER_TARGET ** (1 / cells),
                                  what=f"claim 3 held-out evaluation (Holm over {cells} cells, all of which must pass)")


def claim_3(sft: dict[tuple[str, str], dict[str, Any]], specialists: dict[tuple[str, str], dict[str, Any]], *,
            profile: str, checkpoints: dict[str, str] | None = None) -> Claim:
    """`sft[(domain, effort)]` and `specialists[(domain, effort)]`: {"success_rate", "n"} on the same
    held-out tasks and seeds; a specialist also {"paired": {"b", "c", "n"}} (tasks only it / only
    sft_policy solved), {"mean_policy_tokens", "hard": {"success_rate", "n"}} and, when the evaluation
    gives them, {"greedy": {"success_rate", "n"}, "pass_at_8": rate} (shown: sharpening shows as a
    pass@1 gain without a pass@8 one); sft_policy at low also {"hard": {"success_rate", "n"}}.

    Per specialist: gain ≥ SPECIALIST_GAIN, the paired 95 % lower bound > 0 and the exact McNemar
    test rejecting at ALPHA after Holm across the nine. Per domain: tokens low < high < max; on the
    hard split max ≥ low, judged only where sft_policy at low scores < HARD_BELOW there (and not
    where both score 0: a vacuous 0 ≥ 0)."""
    target = (f"each of 9 specialists ≥ SFT + {SPECIALIST_GAIN * 100:.0f} points, paired 95 % lower bound > 0, "
              f"McNemar Holm-corrected across the 9 at {ALPHA:g}; tokens low < high < max; on the hard split "
              f"max ≥ low where SFT at low < {HARD_BELOW:.0%}")
    effect = f"a true +{POWERED_GAIN * 100:.0f} points"
    cells = [(d, e) for d in DOMAINS for e in EFFORTS]
    if not any(_rate(specialists.get(c)) for c in cells):
        return not_measured(3, target, "no specialist reports its evaluation", profile, checkpoints)
    problems: list[str] = []
    gains: dict[str, dict[str, Any]] = {}
    tests: dict[str, float] = {}
    for d, e in cells:
        name = f"{d}/{e}"
        spec, base = _rate(specialists.get((d, e))), _rate(sft.get((d, e)))
        if spec is None or base is None:
            problems.append(f"{name}: {'specialist' if spec is None else 'SFT'} not measured")
            continue
        fig = specialists[(d, e)]
        row: dict[str, Any] = {"specialist": spec[0] / spec[1], "sft": base[0] / base[1], "n": spec[1],
                               "power": claim_3_power(base[0] / base[1], spec[1])}
        for extra in ("greedy", "pass_at_8"):
            if fig.get(extra) is not None:
                row[extra] = fig[extra]
        pair = _paired(fig.get("paired"))
        if pair is None:
            row["gain"] = row["specialist"] - row["sft"]
            problems.append(f"{name}: paired outcomes (b, c) not reported, so no paired test")
        else:
            b, c, n = pair
            row["gain"], row["lo"], row["hi"] = stats.paired_difference(b, c, n)
            row.update(b=b, c=c, p_mcnemar=stats.mcnemar_exact(b, c) if b > c else 1.0)
            tests[name] = row["p_mcnemar"]
        gains[name] = row
    if tests:
        adjusted, _ = stats.holm(list(tests.values()), ALPHA)
        for name, p_adj in zip(tests, adjusted):
            g = gains[name]
            g["p_holm"] = p_adj
            g["pass"] = g["gain"] >= SPECIALIST_GAIN - 1e-12 and g["lo"] > 0 and p_adj <= ALPHA
            if not g["pass"]:
                problems.append(f"{name} gains {g['gain'] * 100:+.0f} points [{g['lo'] * 100:+.0f}, "
                                f"{g['hi'] * 100:+.0f}], Holm p {p_adj:.2g}")
    tokens: dict[str, list[float | None]] = {}
    hard: dict[str, str] = {}
    for d in DOMAINS:
        spent = [specialists.get((d, e), {}).get("mean_policy_tokens") for e in EFFORTS]
        tokens[d] = spent
        if any(t is None for t in spent):
            problems.append(f"{d}: tokens per effort not measured")
        elif not spent[0] < spent[1] < spent[2]:
            problems.append(f"{d}: tokens low/high/max {spent[0]:.0f}/{spent[1]:.0f}/{spent[2]:.0f} not increasing")
        hard_low = _rate(specialists.get((d, "low"), {}).get("hard"))
        hard_max = _rate(specialists.get((d, "max"), {}).get("hard"))
        sft_hard = _rate(sft.get((d, "low"), {}).get("hard"))
        if hard_low is None or hard_max is None:
            problems.append(f"{d}: hard tasks not measured")
            hard[d] = "not measured"
        elif sft_hard is None:
            hard[d] = "not judged: sft_policy's hard-split rate at low not measured"
        elif sft_hard[0] / sft_hard[1] >= HARD_BELOW:
            hard[d] = f"not judged: sft_policy at low scores {sft_hard[0] / sft_hard[1]:.2f} ≥ {HARD_BELOW} there"
        elif hard_max[0] == 0 and hard_low[0] == 0:
            hard[d] = "not judged: max and low both score 0 (0 ≥ 0 says nothing)"
        elif hard_max[0] / hard_max[1] < hard_low[0] / hard_low[1]:
            hard[d] = "fail"
            problems.append(f"{d}: hard max {hard_max[0] / hard_max[1]:.2f} < low {hard_low[0] / hard_low[1]:.2f}")
        else:
            hard[d] = "pass"
    powers = [g["power"] for g in gains.values()]
    power_all = math.prod(powers) if powers else None
    power = power_all  # the claim is about all nine at once (module docstring)
    n_min = min((g["n"] for g in gains.values()), default=None)
    figures = {"gains": gains, "tokens": tokens, "hard": hard, "power_all": power_all,
               "powered_gain": POWERED_GAIN}
    mean_gain = sum(g["gain"] for g in gains.values()) / len(gains) if gains else float("nan")
    figure = (f"{sum(1 for g in gains.values() if g.get('pass'))}/9 specialists beat SFT by ≥ "
              f"{SPECIALIST_GAIN * 100:.0f} points (mean gain {mean_gain * 100:+.1f}; per-cell power "
              f"{min(powers, default=float('nan')):.2f}–{max(powers, default=float('nan')):.2f}, all nine "
              f"{power_all if power_all is not None else float('nan'):.2f})")
    if not problems:
        return _claim(3, PASS, figure, target, "every specialist, token and judged hard-split condition holds",
                      profile, checkpoints, figures, n=n_min, power=power, effect=effect)
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    return _claim(3, FAIL, figure, target, "; ".join(problems[:3]) + more, profile, checkpoints, figures,
                  n=n_min, power=power, effect=effect)


def claim_4(cells: dict[tuple[str, str], dict[str, Any]], *, profile: str,
            checkpoints: dict[str, str] | None = None) -> Claim:
    """`cells[(domain, effort)]`: {"teacher", "student", "sft": success rates on the same held-out
    tasks, "n"} and, when reported, {"paired": {"b", "c", "n"}} of the teacher against sft_policy.

    Judged on the cells where the teacher beats sft_policy (paired: Agresti–Min lower bound > 0 and
    McNemar p ≤ ALPHA; Newcombe's lower bound > 0 when the pairs are not reported); the others read
    "nothing to retain". Pass: the pooled retained gain Σ n(student − sft) / Σ n(teacher − sft) ≥
    RETENTION with its 95 % lower bound ≥ RETENTION_LOWER (stats.retention_from_counts). A (domain,
    effort) absent from `cells` was not distilled (mopd_student.domains/efforts): named in
    `figures["not_distilled"]` and the figure, judged neither way."""
    target = (f"pooled retained gain (student − SFT)/(teacher − SFT) ≥ {RETENTION:.0%} with 95 % lower bound ≥ "
              f"{RETENTION_LOWER:.0%}, over the cells where the teacher beats SFT")
    effect = "a student identical to its teachers"
    names = [(d, e) for d in DOMAINS for e in EFFORTS]
    measured = {c: v for c, v in cells.items() if c in names and all(v.get(k) is not None for k in
                                                                     ("teacher", "student", "sft", "n"))}
    if not measured:
        return not_measured(4, target, "the MOPD student, its teachers or sft_policy report no evaluation on the "
                            "same tasks", profile, checkpoints)
    retention: dict[str, float | None] = {}
    per_cell: dict[str, dict[str, Any]] = {}
    judged = []
    for (d, e), v in measured.items():
        name, n = f"{d}/{e}", int(v["n"])
        pair = _paired(v.get("paired"))
        if pair is not None:
            _, lo, _ = stats.paired_difference(*pair)
            beats = lo > 0 and pair[0] > pair[1] and stats.mcnemar_exact(pair[0], pair[1]) <= ALPHA
        else:
            _, lo, _ = stats.newcombe(v["teacher"] * n, n, v["sft"] * n, n)
            beats = lo > 0
        gain = v["teacher"] - v["sft"]
        retention[name] = (v["student"] - v["sft"]) / gain if beats else None
        per_cell[name] = {"teacher": v["teacher"], "student": v["student"], "sft": v["sft"], "n": n,
                          "teacher_gain_lo": lo, "judged": beats,
                          "retention": retention[name] if beats else "nothing to retain"}
        if beats:
            judged.append((v["student"], v["teacher"], v["sft"], n))
    figures: dict[str, Any] = {"retention": retention, "cells": per_cell}
    absent = [f"{d}/{e}" for d, e in names if (d, e) not in cells]
    if absent:
        figures["not_distilled"] = absent
    if not judged:
        return _claim(4, NOT_MEASURED, f"no teacher beats sft_policy in {len(measured)} cell(s)", target,
                      "nothing to retain: no teacher's gain over sft_policy is above 0 (paired 95 %)", profile,
                      checkpoints, figures)
    r, lo, hi = stats.retention_from_counts(judged)
    power = stats.retention_power([(t, f, n) for _, t, f, n in judged], point=RETENTION, lower=RETENTION_LOWER)
    n_min = min(n for *_, n in judged)
    figures.update(pooled=r, pooled_lo=lo, pooled_hi=hi)
    figure = (f"pooled retained gain {r:.0%} [{lo:.0%}, {hi:.0%}] over {len(judged)} cell(s) where the teacher "
              f"beats SFT; {len(measured) - len(judged)} with nothing to retain"
              + (f"; {len(absent)} of {len(names)} not distilled" if absent else ""))
    ok = r >= RETENTION and lo >= RETENTION_LOWER
    why = (f"retained {r:.0%} ≥ {RETENTION:.0%}, lower bound {lo:.0%} ≥ {RETENTION_LOWER:.0%}" if ok else
           f"retained {r:.0%} (lower bound {lo:.0%}) against ≥ {RETENTION:.0%} with ≥ {RETENTION_LOWER:.0%}")
    return _claim(4, PASS if ok else FAIL, figure, target, why, profile, checkpoints, figures, n=n_min, power=power,
                  effect=effect)


def claim_5(qat: dict[str, float], ptq: dict[str, float], *, metric: str, higher_is_better: bool, profile: str,
            checkpoints: dict[str, str] | None = None, seed_drops: dict[str, list[float]] | None = None,
            n: int | None = None, scope: str | None = None) -> Claim:
    """`qat` and `ptq`: {"bf16": x, "mxfp4": y}, one metric of the QAT-trained and the plainly trained
    model after MXFP4 quantization (`mxfp4`) and of the high-precision model each drop is measured
    from (`bf16`), averaged over seeds; `seed_drops` {"qat": [...], "ptq": [...]}: each seed's drop;
    `n` the held-out windows; `scope` the quantization scope (k3model.train.qat.QUANT_SCOPES).

    Judged only where PTQ measurably hurts: PTQ's mean drop ≥ MIN_PTQ_DROP and ≥ SEED_SPREAD_FACTOR ×
    the spread (max − min) of its drops over ≥ 2 seeds; otherwise "underpowered" (shown, not judged).
    Not a sampling test of a rate: `power` is None, the note says so."""
    target = (f"QAT's drop at MXFP4 ≤ {QAT_SHARE:g}× PTQ's (on {metric}{f', scope {scope}' if scope else ''}), "
              f"judged when PTQ's drop ≥ {MIN_PTQ_DROP:g} and ≥ {SEED_SPREAD_FACTOR:g}× its seed spread")
    if not all(k in f for f in (qat, ptq) for k in ("bf16", "mxfp4")):
        return not_measured(5, target, "the QAT or PTQ figures are missing", profile, checkpoints)
    sign = 1.0 if higher_is_better else -1.0
    drop_qat = sign * (qat["bf16"] - qat["mxfp4"])
    drop_ptq = sign * (ptq["bf16"] - ptq["mxfp4"])
    ptq_seeds = list((seed_drops or {}).get("ptq") or [])
    spread = max(ptq_seeds) - min(ptq_seeds) if len(ptq_seeds) >= 2 else None
    figures = {"metric": metric, "higher_is_better": higher_is_better, "qat": dict(qat), "ptq": dict(ptq),
               "drop_qat": drop_qat, "drop_ptq": drop_ptq, "seed_drops": dict(seed_drops or {}),
               "ptq_seed_spread": spread, "scope": scope,
               "power_note": "not a sampling test of a rate: judged on PTQ's drop against its seed spread"}
    figure = (f"{metric} drop QAT {drop_qat:.4g} ({qat['bf16']:.4g} → {qat['mxfp4']:.4g}), PTQ {drop_ptq:.4g} "
              f"({ptq['bf16']:.4g} → {ptq['mxfp4']:.4g})"
              + (f", PTQ seed spread {spread:.2g} over {len(ptq_seeds)} seeds" if spread is not None else ""))
    if spread is None:
        return _claim(5, UNDERPOWERED, figure, target, "PTQ's drop was measured on fewer than two seeds, so its "
                      "spread is unknown: shown, not judged", profile, checkpoints, figures, n=n)
    if drop_ptq < MIN_PTQ_DROP or drop_ptq < SEED_SPREAD_FACTOR * spread:
        return _claim(5, UNDERPOWERED, figure, target, f"PTQ's drop {drop_ptq:.4g} is below {MIN_PTQ_DROP:g} or "
                      f"{SEED_SPREAD_FACTOR:g}× its seed spread {spread:.2g}: quantization does not measurably hurt "
                      "here, shown, not judged", profile, checkpoints, figures, n=n)
    verdict = PASS if drop_qat <= QAT_SHARE * drop_ptq else FAIL
    return _claim(5, verdict, figure, target, f"QAT loses {drop_qat / drop_ptq:.0%} of PTQ's drop", profile,
                  checkpoints, figures, n=n)


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
    """`folds[held-out harness]`: the multi-harness RL arm's success `in_harness` (its trained
    harnesses) and `held_out` (the held-out one), sft_policy's `sft_in_harness` and `sft_held_out` on
    the same tasks, and the episode counts `n_in_harness`, `n_held_out`; `control[held-out harness]`,
    if given, the single-harness arm's transfer ratio (shown, not judged).

    Per fold the transfer of the RL gain R = (held_out − sft_held_out) / (in_harness − sft_in_harness)
    (stats.gain_ratio); pass when R ≥ TRANSFER in every fold. A fold without an in-harness gain reads
    "nothing to transfer" and is not judged; the fold of the harness SFT never saw (HELD_OUT_HARNESS) is
    zero-shot syntax transfer, shown apart and not judged (expected to fail: no RL can teach a syntax)."""
    target = f"the RL gain in the held-out harness ≥ {TRANSFER:.0%} of the in-harness gain, in every fold"
    effect = "perfect transfer of the RL gain"
    keys = ("in_harness", "held_out", "sft_in_harness", "sft_held_out", "n_in_harness", "n_held_out")
    shown = {h: f for h, f in folds.items() if f.get("in_harness") is not None and f.get("held_out") is not None}
    if not shown:
        return not_measured(7, target, "no held-out harness evaluated", profile, checkpoints)
    old = "; ".join(f"held out {h}: {f['held_out']:.2f} vs in-harness {f['in_harness']:.2f}" for h, f in shown.items())
    measured = {h: f for h, f in shown.items() if all(f.get(k) is not None for k in keys)}
    if not measured:
        return _claim(7, NOT_MEASURED, old, target, "sft_policy's success in each harness (or the episode counts) "
                      "is not reported, so the RL gain and its transfer cannot be formed", profile, checkpoints,
                      {"folds": shown})
    ratios: dict[str, dict[str, Any]] = {}
    powers = []
    for h, f in measured.items():
        held, inside = (f["held_out"], f["sft_held_out"]), (f["in_harness"], f["sft_in_harness"])
        ns_held, ns_in = (int(f["n_held_out"]),) * 2, (int(f["n_in_harness"]),) * 2
        r, lo, hi = stats.gain_ratio(held, ns_held, inside, ns_in)
        ratios[h] = {"transfer": r, "lo": lo, "hi": hi, "gain_in": inside[0] - inside[1],
                     "gain_held": held[0] - held[1]}
        if r is not None:
            powers.append((h, stats.gain_ratio_power(held, ns_held, inside, ns_in, point=TRANSFER)))
    figures = {"folds": measured, "transfer": ratios, "control": dict(control or {})}
    figure = "; ".join(f"held out {h}: gain {v['gain_held'] * 100:+.0f} vs in-harness {v['gain_in'] * 100:+.0f} points"
                       + (f" ({v['transfer']:.0%} [{v['lo']:.0%}, {v['hi']:.0%}])" if v["transfer"] is not None
                          else " (nothing to transfer)") for h, v in ratios.items())
    if control:
        figure += " — single-harness control " + ", ".join(f"{h} {v:.0%}" for h, v in control.items())
    if HELD_OUT_HARNESS in ratios:
        figure += f" — {HELD_OUT_HARNESS} (a syntax SFT never saw) is zero-shot transfer: shown, not judged"
    judged = {h: v for h, v in ratios.items() if v["transfer"] is not None and h != HELD_OUT_HARNESS}
    if not judged:
        return _claim(7, NOT_MEASURED, figure, target, "no fold of a harness SFT saw has an in-harness RL gain: "
                      "nothing to transfer", profile, checkpoints, figures)
    power = math.prod(p for h, p in powers if h in judged)
    n_min = min(min(int(measured[h]["n_in_harness"]), int(measured[h]["n_held_out"])) for h in judged)
    worst = min(judged, key=lambda h: judged[h]["transfer"])
    status = PASS if judged[worst]["transfer"] >= TRANSFER else FAIL
    return _claim(7, status, figure, target, f"the worst fold ({worst} held out) keeps {judged[worst]['transfer']:.0%} "
                  "of its RL gain", profile, checkpoints, figures, n=n_min, power=power, effect=effect)


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
        return _claim(8, FAIL, figure, target, f"wrong on {', '.join(missed[:4])}", profile, checkpoints, figures,
                      n=len(rows))
    why = (f"a sample of the corpus ({of('hack', len(hacks))} hacks, {of('honest', len(honest))} honest)" if sample
           else "the whole corpus")
    return _claim(8, PASS, figure, target, f"right on {why}", profile, checkpoints, figures, n=len(rows))
