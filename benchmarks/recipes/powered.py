"""The powered post-training job beside `make run` (issue 40 item 6's split): claim 3 on the nine cells
at the budgets that can show learning, then claim 4 on one student distilled from them.

    make powered                      # after `make run`: the home under .k3/ (K3_HOME moves it)
    python benchmarks/recipes/powered.py --home .k3 --cells general_tasks/low,general_tasks/high --parallel 2

Why a job of its own: one powered cell (GRPO, G 8 × 4 informative groups, refill ×4, 128 steps, ~7,500
episodes played, then 256 held-out tasks × 8 samples + greedy for sft_policy and the specialist) takes
40–60 core-minutes at tiny on this machine (docs/log/rl.md, sessions 26–29), so the nine take ~3.5 hours
on two cores — more than `make run`'s whole 60 minutes, which keeps its small specialists and reads
claim 3 as underpowered. On a GPU host the same job trains on the GPU (`grpo.train` picks CUDA).

Each cell is `grpo_powered.py` in its own work dir `<work>/<domain>_<effort>` (phases plan, eval_sft,
grpo, eval_specialist, report; each phase is skipped when its JSON exists, so a killed job resumes where
it stopped), `--parallel` cells at once, one thread each. Then:
- claim 3 over the cells run: each cell's paired-bootstrap p of specialist − sft_policy pass@1, Holm
  across the cells (α 0.05); a cell passes when its gain ≥ +10 points, its lower bound > 0 and its Holm
  rejection holds; a cell whose power at +15 (measured before training) is < 0.8 reads "underpowered";
  tokens per episode of the specialists at low < high < max per domain, where all three ran;
- claim 3's hard split, per domain whose low and max cells both ran: 256 harder instances of the family
  they trained on (`ladder.hard_instances`, e.g. compare_numbers_close), played by sft_policy at low (the
  split counts as hard only where it scores < 50 %), the low specialist at low, then — after the test's
  power is computed from the low specialist's per-task rates — the max specialist at max; max ≥ low holds
  when the paired 95 % lower bound of max − low pass@1 exceeds −5 points (`HARD_MARGIN`, pre-registered
  in docs/log/rl.md 2026-12-07); each arm's JSON under `<work>/hard_<domain>/` (resumable);
- claim 4 (`--mopd`): `mopd_powered.py` with every cell run as a teacher (the cells must form a
  domain × effort rectangle: MOPD routes every pair it names), judged on the cells whose teacher passed.
Writes benchmarks/results/posttrain/<date>_powered_<label>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, dated_result, run_header

DOMAINS = ("general_tasks", "general_agents", "coding_agents")
EFFORTS = ("low", "high", "max")
HARD_MARGIN = 0.05
RECIPE = ("--steps", "128", "--groups", "4", "--group-size", "8", "--max-draw-factor", "4", "--lr", "1e-4")


def cell_dir(work: Path, cell: str) -> Path:
    return work / cell.replace("/", "_")


def run_cells(args, cells: list[str], work: Path) -> dict[str, int]:
    """grpo_powered for each cell, `args.parallel` at once; returns each cell's exit code."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    waiting, running, codes = list(cells), {}, {}
    while waiting or running:
        while waiting and len(running) < args.parallel:
            cell = waiting.pop(0)
            out = cell_dir(work, cell)
            out.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, str(Path(ROOT) / "benchmarks/recipes/grpo_powered.py"), "--home", str(args.home),
                   "--cell", cell, *RECIPE, "--skip-control", "--label", f"{args.label}_{cell.replace('/', '_')}",
                   "--work", str(out), "--phases", "plan", "eval_sft", "grpo", "eval_specialist", "report"]
            log = open(out / "log.txt", "a")
            running[cell] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log)
            print(f"{time.strftime('%H:%M:%S')} {cell}: started (log {out / 'log.txt'})", flush=True)
        time.sleep(5)
        for cell, (proc, log) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                codes[cell] = proc.returncode
                del running[cell]
                print(f"{time.strftime('%H:%M:%S')} {cell}: exit {proc.returncode}", flush=True)
    return codes


def claim3(cells: list[str], work: Path) -> dict:
    """The nine (or fewer) cells side by side, Holm across them, tokens by effort."""
    from k3model.train import stats
    from k3model.train.paired_eval import arm_row, compare_arms
    rows = {}
    for cell in cells:
        d = cell_dir(work, cell)
        phases = {p: d / f"{p}.json" for p in ("plan", "eval_sft", "eval_specialist")}
        if not all(p.exists() for p in phases.values()):
            sft = json.loads(phases["eval_sft"].read_text()) if phases["eval_sft"].exists() else None
            power = sft["power"]["pass1_bootstrap"] if sft else None
            if power is not None and power < stats.POWER_TARGET:  # grpo_powered refuses to train it
                rows[cell] = {"verdict": "underpowered", "power": power,
                              "why": f"power {power:.2f} < {stats.POWER_TARGET} at +15 on {d}'s held-out tasks"
                                     + (f" ({sft['power']['why']})" if "why" in sft["power"] else "") + ": not trained"}
            else:
                rows[cell] = {"verdict": "not run", "why": f"{d} lacks " + ", ".join(
                    n for n, p in phases.items() if not p.exists()) + f" (see {d / 'log.txt'})"}
            continue
        plan, sft, spec = (json.loads(p.read_text()) for p in phases.values())
        k, power = plan["args"]["k"], sft["power"]["pass1_bootstrap"]
        c = compare_arms(spec, sft, k, power >= stats.POWER_TARGET)
        arms = {"sft_policy": arm_row(sft, k), "specialist": arm_row(spec, k)}
        rows[cell] = {"gain": c["pass1"]["gain"], "lo": c["pass1"]["lo"], "hi": c["pass1"]["hi"], "p": c["pass1"]["p"],
                      "rule": c["pass1"]["claim3_rule"], "power": power, "greedy_gain": c["greedy"]["gain"],
                      "passk_gain": c[f"pass{k}"]["gain"], "arms": arms, "work": str(d),
                      "tokens": {a: r["tokens_sampled"] for a, r in arms.items()}}
    judged = [c for c, r in rows.items() if "p" in r]
    adjusted, rejected = stats.holm([rows[c]["p"] for c in judged]) if judged else ([], [])
    for c, a, rej in zip(judged, adjusted, rejected):
        r = rows[c]
        r["p_holm"] = a
        r["verdict"] = ("pass" if r["rule"] and rej else "fail") if r["power"] >= stats.POWER_TARGET else "underpowered"
    tokens = {}
    for d in DOMAINS:
        t = [rows.get(f"{d}/{e}", {}).get("tokens", {}).get("specialist") for e in EFFORTS]
        if all(x is not None for x in t):
            tokens[d] = {"low_high_max": t, "ordered": t[0] < t[1] < t[2]}
    return {"cells": rows, "passed": sum(r.get("verdict") == "pass" for r in rows.values()), "of": len(rows),
            "tokens_by_effort": tokens}


def hard_split(cells: list[str], work: Path, n: int) -> dict:
    """Per domain with both its low and max cells run: max ≥ low on harder instances of their family."""
    from k3model.train import stats
    from k3model.train.effort import effort_specs
    from k3model.train.grpo import GRPOConfig
    from k3model.train.ladder import hard_instances
    from k3model.train.paired_eval import arm_row, compare_not_worse, score_policy
    from k3model.train.recipes import POSTTRAIN_SIZES
    specs = effort_specs(POSTTRAIN_SIZES["tiny"].eval_budgets) or GRPOConfig().efforts  # as grpo_powered scores
    out = {}
    for domain in DOMAINS:
        if f"{domain}/low" not in cells or f"{domain}/max" not in cells:
            continue
        low, top = cell_dir(work, f"{domain}/low"), cell_dir(work, f"{domain}/max")
        lacking = [str(p) for p in (low / "eval_specialist.json", top / "eval_specialist.json") if not p.exists()]
        if lacking:
            out[domain] = {"verdict": "not run", "why": f"missing {lacking}"}
            continue
        plan = json.loads((low / "plan.json").read_text())
        if json.loads((top / "plan.json").read_text())["families"] != plan["families"]:
            out[domain] = {"verdict": "not judgeable", "why": "the low and max specialists trained on different families"}
            continue
        try:
            tasks = hard_instances(plan["families"], -(-n // len(plan["families"])))
        except ValueError as e:
            out[domain] = {"verdict": "no hard split", "why": str(e)}
            continue
        k, seed = plan["args"]["k"], plan["args"]["eval_seed"]
        hard_dir = work / f"hard_{domain}"
        hard_dir.mkdir(parents=True, exist_ok=True)
        arms = {}
        for name, checkpoint, effort in (
                ("sft_policy_low", plan["policy"], "low"),
                ("low_specialist", json.loads((low / "eval_specialist.json").read_text())["checkpoint"], "low"),
                ("max_specialist", json.loads((top / "eval_specialist.json").read_text())["checkpoint"], "max")):
            path = hard_dir / f"{name}.json"
            if not path.exists():
                path.with_suffix(".tmp").write_text(json.dumps(score_policy(
                    checkpoint, f"hard {domain} {name}", plan["tokenizer"], tasks, effort, k=k, seed=seed, specs=specs),
                    default=float))
                path.with_suffix(".tmp").rename(path)
            arms[name] = json.loads(path.read_text())
            if name == "low_specialist" and not (hard_dir / "power.json").exists():
                # The test's power, from the low specialist's per-task rates, before the max arm is scored.
                power = stats.noninferiority_power(arms[name]["sampled"]["per_task"], k, HARD_MARGIN)
                (hard_dir / "power.json").write_text(json.dumps({"power": power, "margin": HARD_MARGIN,
                                                                 "at": time.strftime("%Y-%m-%d %H:%M:%S")}))
        power = json.loads((hard_dir / "power.json").read_text())["power"]
        rows = {a: arm_row(r, k) for a, r in arms.items()}
        c = compare_not_worse(arms["max_specialist"], arms["low_specialist"], k, HARD_MARGIN,
                              power >= stats.POWER_TARGET)
        hard = rows["sft_policy_low"]["pass1"] < 0.5
        out[domain] = {"families": [t.family for t in tasks[:1]], "n": len(tasks), "arms": rows, "power": power,
                       "sft_low_below_half": hard, "max_minus_low": c,
                       "verdict": c["pass1"]["verdict"] if hard else "not hard (sft_policy at low ≥ 50 %)"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--home", default=os.environ.get("K3_HOME") or str(Path(ROOT) / ".k3"),
                    help="a K3_HOME holding tiny's sft_policy, rl_tasks and tokenizer (make run's)")
    ap.add_argument("--cells", default=",".join(f"{d}/{e}" for d in DOMAINS for e in EFFORTS))
    ap.add_argument("--parallel", type=int, default=2, help="cells at once (one thread each on the CPU)")
    ap.add_argument("--mopd", action="store_true", help="then distil one student from the cells' specialists")
    ap.add_argument("--hard-n", type=int, default=256, help="hard-split tasks per domain (max ≥ low)")
    ap.add_argument("--label", default="nine")
    ap.add_argument("--work", default=None, help="default <home>/powered")
    args = ap.parse_args()
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    bad = [c for c in cells if c.count("/") != 1 or c.split("/")[0] not in DOMAINS or c.split("/")[1] not in EFFORTS]
    if bad:
        raise SystemExit(f"unknown cell(s) {bad}: choose domain/effort from {DOMAINS} × {EFFORTS}")
    if args.parallel < 1:
        raise SystemExit(f"--parallel must be ≥ 1, got {args.parallel}")
    if args.hard_n < 2:
        raise SystemExit(f"--hard-n must be ≥ 2 tasks (a paired test), got {args.hard_n}")
    missing = [a for a in ("checkpoints/tiny/sft_policy", "data/tiny/rl_tasks", "data/tiny/tokenizer")
               if not any((Path(args.home) / a).glob("*"))]
    if missing:
        raise SystemExit(f"{args.home} holds no tiny {', '.join(m.rsplit('/', 1)[1] for m in missing)}: run `make run` "
                         "first (or pass --home, a K3_HOME where tiny's sft_policy, rl_tasks and tokenizer are)")
    work = Path(args.work or Path(args.home) / "powered")
    t0 = time.perf_counter()
    codes = run_cells(args, cells, work)
    out = {"header": run_header(), "args": vars(args), "exit_codes": codes, "claim3": claim3(cells, work)}
    out["claim3"]["hard_split"] = hard_split(cells, work, args.hard_n)
    if args.mopd:
        teachers = [str(cell_dir(work, c)) for c in cells if codes.get(c) == 0]
        # ≥ 300 student episodes a route over 64 steps (mopd_powered refuses fewer).
        per_step = max(32, -(-320 * len(teachers) // 64))
        cmd = [sys.executable, str(Path(ROOT) / "benchmarks/recipes/mopd_powered.py"), "--teachers", *teachers,
               "--steps", "64", "--episodes-per-step", str(per_step), "--lr", "1e-4", "--label", args.label,
               "--work", str(work / "mopd")]
        proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        report = work / "mopd" / "report.json"
        out["claim4"] = json.loads(report.read_text()) if report.exists() else {"exit": proc.returncode}
    out["wall_s"] = time.perf_counter() - t0
    path = dated_result("posttrain", f"powered_{args.label}", out)
    for cell, r in out["claim3"]["cells"].items():
        if "gain" in r:
            print(f"{cell}: {r['gain'] * 100:+.1f} [{r['lo'] * 100:+.1f}, {r['hi'] * 100:+.1f}] Holm p "
                  f"{r['p_holm']:.4f} power {r['power']:.2f} → {r['verdict']}")
        else:
            print(f"{cell}: {r['verdict']} ({r['why']})")
    for domain, r in out["claim3"]["hard_split"].items():
        if "max_minus_low" in r:
            d = r["max_minus_low"]["pass1"]
            print(f"hard split {domain} ({r['families'][0]}, n {r['n']}): sft_policy at low {r['arms']['sft_policy_low']['pass1']:.3f}, "
                  f"low {r['arms']['low_specialist']['pass1']:.3f}, max {r['arms']['max_specialist']['pass1']:.3f}; max − low "
                  f"{d['difference'] * 100:+.1f} [{d['lo'] * 100:+.1f}, {d['hi'] * 100:+.1f}] power {r['power']:.2f} → {r['verdict']}")
        else:
            print(f"hard split {domain}: {r['verdict']} ({r['why']})")
    print(f"claim 3: {out['claim3']['passed']} of {out['claim3']['of']} cells pass; tokens by effort "
          f"{out['claim3']['tokens_by_effort']} → {path}", flush=True)


if __name__ == "__main__":
    main()
