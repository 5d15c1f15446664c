"""Claim 7 as issue 41 item 2 states it, one fold with power: does the RL gain carry to a harness that
RL never rendered its episodes in?

One GRPO arm (`grpo_powered.py --train-harnesses` without the held-out harness h) is scored twice on
the same held-out tasks and sampling seeds, each time beside sft_policy: in its trained harnesses
(`--in-work`, a grpo_powered work dir with `--eval-harnesses` = the trained ones) and in h alone
(`--held-work`: the same plan and grpo.json, `--eval-harnesses h`, its own eval_sft and
eval_specialist). Per task u = arm − sft_policy in h and v = arm − sft_policy in-harness (pass@1 of k
samples at T = 1); the fold's transfer of the RL gain R = Σu / Σv with the paired delta-method 95 %
interval (`stats.paired_gain_ratio`). Claim 7's rule (assets/claims.py): pass when R ≥ 0.8.

    python benchmarks/recipes/transfer_powered.py --in-work W_IN --held-work W_H --phases power
    python benchmarks/recipes/transfer_powered.py --in-work W_IN --held-work W_H --label L --phases report

`power` (run once both eval_sft phases are done, before the arm is scored): the probability that R̂ ≥
0.8 when the arm truly gains `--effect` in-harness and all of it in h (`stats.transfer_power_paired`,
sft_policy's measured per-task counts as the fixed data); written to `<held-work>/transfer_power.json`.
`report` writes benchmarks/results/posttrain/<date>_transfer_powered_<label>.json; below a power of 0.8
the verdict reads "underpowered".

    python benchmarks/recipes/transfer_powered.py --in-work W_IN --held-work W_H --control-in-work C_IN \
        --control-held-work C_H --label L --phases control

`control` (issue 41 item 2's single-harness arm, descriptive: no verdict): the same fold's control arm,
trained in one harness and scored in it (`C_IN`) and in h (`C_H`) on the same tasks and seeds; its R
beside the fold arm's, and R_fold − R_control with a paired bootstrap interval over the tasks
(`stats.paired_ratio_difference`); writes <date>_transfer_control_<label>.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import dated_result, run_header

TRANSFER = 0.8  # assets.claims.TRANSFER


def main() -> None:
    from k3model.train import stats

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--in-work", required=True, help="grpo_powered work dir scored in the arm's trained harnesses")
    ap.add_argument("--held-work", required=True, help="the same arm's work dir scored in the held-out harness")
    ap.add_argument("--effect", type=float, default=0.15, help="the in-harness gain the power is computed at")
    ap.add_argument("--control-in-work", default=None, help="the single-harness control arm scored in its harness")
    ap.add_argument("--control-held-work", default=None, help="the control arm scored in the held-out harness")
    ap.add_argument("--phases", nargs="+", default=["power", "report"], choices=["power", "report", "control"])
    ap.add_argument("--label", default=None)
    args = ap.parse_args()

    w_in, w_h = Path(args.in_work), Path(args.held_work)
    plan_in, held = fold_plan(w_in, w_h)
    k = plan_in["args"]["k"]
    sft_h, sft_in = read(w_h, "eval_sft")["sampled"]["per_task"], read(w_in, "eval_sft")["sampled"]["per_task"]

    if "power" in args.phases:
        power = stats.transfer_power_paired(sft_h, sft_in, k, args.effect, point=TRANSFER, sims=1000)
        out = {"header": run_header(), "held_out": held[0], "trained": plan_in["train_harnesses"],
               "effect": args.effect, "point": TRANSFER, "power": power,
               "sft_pass1_held": sum(sft_h) / (k * len(sft_h)), "sft_pass1_in": sum(sft_in) / (k * len(sft_in))}
        (w_h / "transfer_power.json").write_text(json.dumps(out, indent=1))
        print(f"fold {held[0]}: sft_policy pass@1 {out['sft_pass1_held']:.3f} held out / {out['sft_pass1_in']:.3f} "
              f"in-harness; power of R ≥ {TRANSFER} at a true +{args.effect * 100:.0f} in-harness, all of it "
              f"transferred: {power:.2f}", flush=True)
    if "report" in args.phases:
        if not args.label:
            raise SystemExit("report needs --label")
        power = read(w_h, "transfer_power")
        arm_h, arm_in = read(w_h, "eval_specialist"), read(w_in, "eval_specialist")
        rows = {}
        for where, sft, arm in (("held_out", read(w_h, "eval_sft"), arm_h), ("in_harness", read(w_in, "eval_sft"), arm_in)):
            for name, a in (("sft_policy", sft), ("arm", arm)):
                s, g = a["sampled"]["per_task"], a["greedy"]["per_task"]
                rows[f"{where}/{name}"] = {"pass1": sum(s) / (k * len(s)), f"pass{k}": sum(x > 0 for x in s) / len(s),
                                           "greedy": sum(g) / len(g), "n": len(s)}
        u, v = fold_gains(w_in, w_h)
        r, lo, hi = stats.paired_gain_ratio([(u, v)])
        gains = {where: stats.paired_bootstrap([x / k for x in a["sampled"]["per_task"]], [x / k for x in f],
                                               resamples=10_000, seed=0)
                 for where, a, f in (("held_out", arm_h, sft_h), ("in_harness", arm_in, sft_in))}
        if r is None:
            verdict = "nothing to transfer"
        else:
            verdict = ("pass" if r >= TRANSFER else "fail") if power["power"] >= stats.POWER_TARGET else "underpowered"
        out = {"header": run_header(), "held_out": held[0], "trained": plan_in["train_harnesses"], "arms": rows,
               "gain": {w: dict(zip(("gain", "lo", "hi", "p"), g)) for w, g in gains.items()},
               "transfer": {"ratio": r, "lo": lo, "hi": hi, "rule": f"R ≥ {TRANSFER}", "verdict": verdict,
                            "power": power["power"], "power_at": {"effect": power["effect"], "transfer": 1.0}},
               "work": {"in": str(w_in), "held": str(w_h)}, "policy": plan_in["policy"], "cell": plan_in["cell"]}
        path = dated_result("posttrain", f"transfer_powered_{args.label}", out)
        for name, row in rows.items():
            print(f"| {name} | {row['pass1']:.3f} | {row['greedy']:.3f} | {row[f'pass{k}']:.3f} | {row['n']} |")
        for w, g in gains.items():
            print(f"{w}: arm − sft_policy {g[0] * 100:+.1f} [{g[1] * 100:+.1f}, {g[2] * 100:+.1f}]")
        print(f"fold {held[0]}: transfer of the RL gain {r} [{lo}, {hi}] → {verdict} (power {power['power']:.2f}) → {path}",
              flush=True)
    if "control" in args.phases:
        if not (args.label and args.control_in_work and args.control_held_work):
            raise SystemExit("control needs --label, --control-in-work and --control-held-work")
        c_in, c_h = Path(args.control_in_work), Path(args.control_held_work)
        plan_c, held_c = fold_plan(c_in, c_h)
        if held_c != held or plan_c["heldout_tasks"] != plan_in["heldout_tasks"] or plan_c["args"]["eval_seed"] != \
                plan_in["args"]["eval_seed"] or plan_c["args"]["k"] != k:
            raise SystemExit("the control arm is scored on other tasks, seeds or held-out harness than the fold's arm")
        fold, control = fold_gains(w_in, w_h), fold_gains(c_in, c_h)
        ratios = {name: dict(zip(("ratio", "lo", "hi"), stats.paired_gain_ratio([uv])), trained=plan["train_harnesses"])
                  for name, uv, plan in (("fold", fold, plan_in), ("control", control, plan_c))}
        d, lo, hi, undefined = stats.paired_ratio_difference(fold, control, resamples=10_000, seed=0)
        out = {"header": run_header(), "held_out": held[0], "ratios": ratios,
               "difference": {"fold_minus_control": d, "lo": lo, "hi": hi, "undefined_resamples": undefined,
                              "interval": "paired percentile bootstrap over tasks, 95 %"},
               "verdict": None, "work": {"in": str(w_in), "held": str(w_h), "control_in": str(c_in),
                                         "control_held": str(c_h)}, "cell": plan_in["cell"]}
        path = dated_result("posttrain", f"transfer_control_{args.label}", out)
        for name, r in ratios.items():
            print(f"{name} arm (trained in {', '.join(r['trained'])}): R {r['ratio']} [{r['lo']}, {r['hi']}]")
        print(f"R_fold − R_control {d} [{lo}, {hi}] (descriptive) → {path}", flush=True)


def read(work: Path, phase: str) -> dict:
    p = work / f"{phase}.json"
    if not p.exists():
        raise SystemExit(f"{p} does not exist: run grpo_powered.py's {phase} phase there first")
    return json.loads(p.read_text())


def fold_plan(w_in: Path, w_h: Path) -> tuple[dict, list[str]]:
    """The in-harness work dir's plan and the held-out harness, once the two dirs are checked to be one arm's
    fold: the same held-out tasks and seeds, the held-out dir scoring one harness the arm never trained in."""
    plan_in, plan_h = read(w_in, "plan"), read(w_h, "plan")
    if plan_in["heldout_tasks"] != plan_h["heldout_tasks"] or plan_in["args"]["eval_seed"] != plan_h["args"]["eval_seed"]:
        raise SystemExit(f"{w_in} and {w_h} score different held-out tasks or seeds: not one fold")
    held = plan_h["eval_harnesses"]
    if not isinstance(held, list) or len(held) != 1:
        raise SystemExit(f"{w_h} must score one harness (grpo_powered --eval-harnesses h), got {held!r}")
    if held[0] in plan_in["train_harnesses"]:
        raise SystemExit(f"{held[0]} is one of the arm's trained harnesses {plan_in['train_harnesses']}: not held out")
    return plan_in, held


def fold_gains(w_in: Path, w_h: Path) -> tuple[list[float], list[float]]:
    """(u, v) per task: the arm's pass@1 gain over sft_policy in the held-out harness and in its trained ones."""
    k = read(w_in, "plan")["args"]["k"]

    def gains(work: Path) -> list[float]:
        arm, sft = read(work, "eval_specialist")["sampled"]["per_task"], read(work, "eval_sft")["sampled"]["per_task"]
        return [(a - f) / k for a, f in zip(arm, sft)]
    return gains(w_h), gains(w_in)


if __name__ == "__main__":
    main()
