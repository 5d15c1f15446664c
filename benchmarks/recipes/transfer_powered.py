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
    ap.add_argument("--phases", nargs="+", default=["power", "report"], choices=["power", "report"])
    ap.add_argument("--label", default=None)
    args = ap.parse_args()

    w_in, w_h = Path(args.in_work), Path(args.held_work)

    def read(work: Path, phase: str) -> dict:
        p = work / f"{phase}.json"
        if not p.exists():
            raise SystemExit(f"{p} does not exist: run grpo_powered.py's {phase} phase there first")
        return json.loads(p.read_text())

    plan_in, plan_h = read(w_in, "plan"), read(w_h, "plan")
    if plan_in["heldout_tasks"] != plan_h["heldout_tasks"] or plan_in["args"]["eval_seed"] != plan_h["args"]["eval_seed"]:
        raise SystemExit("the two work dirs score different held-out tasks or seeds: not one fold")
    held = plan_h["eval_harnesses"]
    if not isinstance(held, list) or len(held) != 1:
        raise SystemExit(f"--held-work must score one harness (grpo_powered --eval-harnesses h), got {held!r}")
    if held[0] in plan_in["train_harnesses"]:
        raise SystemExit(f"{held[0]} is one of the arm's trained harnesses {plan_in['train_harnesses']}: not held out")
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
        u = [(a - f) / k for a, f in zip(arm_h["sampled"]["per_task"], sft_h)]
        v = [(a - f) / k for a, f in zip(arm_in["sampled"]["per_task"], sft_in)]
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


if __name__ == "__main__":
    main()
