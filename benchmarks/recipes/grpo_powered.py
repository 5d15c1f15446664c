"""One RL cell at ~2,000 episodes against sft_policy and an equal-token SFT control, on ≥ 256 paired
held-out tasks (issue 40 items 4 and 7, one cell first).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/recipes/grpo_powered.py --home /work/rl-home23 \
        --cell general_tasks/low --steps 64 --groups 8 --group-size 4 --lr 1e-4 --label gt_low_lr1e-4

Arms, each scored on the same held-out tasks with the same sampling seeds:
- sft_policy, the home's checkpoint;
- the specialist: `grpo.train` from sft_policy on the cell's RL prompts, as `rl_specialist`'s task body
  (`assets.posttrain_tasks.train_specialist_task`) calls it — the same config fields, the tiny
  row's budgets (`recipes.POSTTRAIN_SIZES["tiny"].eval_budgets`), FLOPs counted — but without that
  body's own evaluation, which scores one episode per task;
- the control: sft_policy trained further by the SFT trainer on verified demonstrations of the
  cell's families at its effort for as many labelled tokens as the specialist's loss saw
  (`k3model.train.sft_control`).

Tasks: the families the home's `rl_tasks` ladder selected for the cell. RL prompts: `--rl-tasks`
seeds per family from `ladder.RL_SEED_BASE`, one task per distinct instruction. Held-out:
`ladder.heldout_tasks` (seeds from `EVAL_SEED_BASE`, none with an RL prompt's instruction), one task
per distinct instruction, `--heldout` in all, split evenly over the families. The control's
demonstrations drop every held-out instruction.

Scoring per arm: k = `--k` episodes per task at temperature 1 (pass@1 = mean successes / k, pass@k
= share of tasks with a success) and one greedy episode per task; the generator seed is the same for
every arm, so episode j of task i draws the same uniforms in every arm.

The test (pre-registered in docs/log/rl.md, 2026-12-05 session 23): per task the difference of the
k-sample pass@1, its mean over tasks and the paired percentile-bootstrap 95 % interval over tasks
(`stats.paired_bootstrap`, 10,000 resamples, seed 0); claim 3's rule: gain ≥ +10 points and the lower
bound > 0 (α = 0.05, one cell); the gate to nine cells: gain ≥ +15. Beside it: greedy by exact
McNemar with the Agresti–Min interval, pass@k by the same bootstrap, and the power at a true +15
points from sft_policy's measured per-task rates and n (`stats.paired_mean_power`; greedy:
`stats.paired_power`).

Phases (`--phases`, default all, in this order; each writes `<work>/<phase>.json` and is skipped
when that file exists, so two processes can share the work: one `grpo control eval_control`, the
other `eval_sft eval_specialist` with `--wait`): plan, eval_sft, grpo, control, eval_specialist,
eval_control, report. `report` writes benchmarks/results/posttrain/<date>_grpo_powered_<label>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.common import dated_result, run_header
from k3model.train.paired_eval import arm_row, compare_arms, score_policy

PHASES = ("plan", "eval_sft", "grpo", "control", "eval_specialist", "eval_control", "report")
NEEDS = {"eval_sft": ("plan",), "grpo": ("plan",), "control": ("grpo",), "eval_specialist": ("grpo",),
         "eval_control": ("control",), "report": ("eval_sft", "eval_specialist", "eval_control")}


def latest(path: Path, pattern: str) -> Path:
    """The newest match of `pattern` under `path` (checkpoints and data sit in run-id folders)."""
    found = sorted(path.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"nothing matches {path}/{pattern}: materialize it first (README: k3 run)")
    return found[-1]


def distinct(tasks: list, n_per_family: int | None = None) -> list:
    """One task per (family, instruction), first seen kept, at most n per family."""
    seen, count, out = set(), {}, []
    for t in tasks:
        key = (t.family, t.instruction)
        if key in seen or (n_per_family is not None and count.get(t.family, 0) >= n_per_family):
            continue
        seen.add(key)
        count[t.family] = count.get(t.family, 0) + 1
        out.append(t)
    return out


def main() -> None:
    import envs
    from k3model.train.effort import effort_specs
    from k3model.train.grpo import GRPOConfig
    from k3model.train.ladder import LadderReport, RL_SEED_BASE, heldout_tasks, tasks_of
    from k3model.train.recipes import POSTTRAIN_SIZES
    tiny = POSTTRAIN_SIZES["tiny"]

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--home", required=True, help="a K3_HOME holding tiny's sft_policy, rl_tasks, tokenizer")
    ap.add_argument("--cell", required=True, help="domain/effort, e.g. general_tasks/low")
    ap.add_argument("--families", default=None,
                    help="comma-separated families instead of the ladder's selection (when rl_tasks is not "
                         "materialized yet; the plan records which, and the ladder's figures when present)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups", type=int, default=8, help="informative groups per step")
    ap.add_argument("--max-draw-factor", type=int, default=tiny.rl_max_draw_factor)
    ap.add_argument("--rl-tasks", type=int, default=256, help="RL seeds per family (distinct instructions kept)")
    ap.add_argument("--heldout", type=int, default=256, help="held-out tasks in all, split over the families")
    ap.add_argument("--k", type=int, default=8, help="episodes per task at temperature 1")
    ap.add_argument("--eval-seed", type=int, default=0)
    ap.add_argument("--control-lr", type=float, default=2e-4,
                    help="peak lr of the control (sft_policy's schedule ends at 2e-3 × 0.1)")
    ap.add_argument("--control-batch", type=int, default=tiny.sft_batch_size)
    ap.add_argument("--control-data-seed", type=int, default=1, help="datagen.sft seed of the control's demos")
    ap.add_argument("--control-budget", type=int, default=None,
                    help="labelled tokens for the control instead of the RL run's (plumbing dry runs only: "
                         "the JSON records which)")
    ap.add_argument("--skip-control", action="store_true",
                    help="report specialist vs sft_policy only (a second lr: no control of its own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-harnesses", default=None,
                    help="comma-separated harnesses GRPO renders its episodes in (default: every training harness); "
                         "a transfer fold leaves one out")
    ap.add_argument("--eval-harnesses", default=None,
                    help="comma-separated harnesses the arms are scored in, round-robin over the tasks (default: "
                         "every training harness); a transfer fold scores the held-out one here")
    ap.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    ap.add_argument("--wait", action="store_true", help="wait for another process's prerequisite phases")
    ap.add_argument("--label", required=True)
    ap.add_argument("--work", default=None, help="default /tmp/grpo_powered/<label>")
    args = ap.parse_args()

    home = Path(args.home)
    work = Path(args.work or f"/tmp/grpo_powered/{args.label}")
    work.mkdir(parents=True, exist_ok=True)
    domain, effort = args.cell.split("/")
    policy = latest(home / "checkpoints/tiny/sft_policy", "*/manifest.json").parent
    tokenizer_path = latest(home / "data/tiny/tokenizer", "*/tokenizer.json")
    ladders = sorted((home / "data/tiny/rl_tasks").glob("*/ladder.json"), key=lambda p: p.stat().st_mtime)
    cell = LadderReport.from_json(json.loads(ladders[-1].read_text())).cell(domain, effort) if ladders else None
    if args.families is None and cell is None:
        raise SystemExit(f"no rl_tasks ladder under {home}: materialize it or pass --families")
    families = args.families.split(",") if args.families else cell.selected
    rl = distinct(tasks_of(families, args.rl_tasks, RL_SEED_BASE))
    per_family = -(-args.heldout // len(families))
    held = distinct(heldout_tasks(families, 3 * per_family, exclude=rl), per_family)
    if len(held) < args.heldout or any(sum(t.family == f for t in held) < per_family for f in families):
        raise SystemExit(f"{args.cell}: only {len(held)} distinct held-out tasks of {families} differ from the "
                         f"{len(rl)} RL prompts; {args.heldout} were asked for — choose a cell whose families "
                         "have more distinct instructions, or fewer RL prompts")
    specs = effort_specs(tiny.eval_budgets)
    grpo_cfg = replace(GRPOConfig(steps=args.steps, group_size=args.group_size, groups_per_step=args.groups,
                                  lr=args.lr, seed=args.seed, max_draw_factor=args.max_draw_factor),
                       **({"efforts": specs} if specs else {}))

    def path_of(phase: str) -> Path:
        return work / f"{phase}.json"

    def read(phase: str) -> dict:
        p = path_of(phase)
        while not p.exists():
            if not args.wait:
                raise SystemExit(f"{phase} has not run in {work}: run it first (--phases {phase}) or pass --wait")
            time.sleep(20)
        return json.loads(p.read_text())

    def write(phase: str, out: dict) -> None:
        tmp = path_of(phase).with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1, default=float))
        tmp.rename(path_of(phase))

    from k3model.train.effort import training_harnesses
    train_harnesses = list(training_harnesses(args.train_harnesses.split(",") if args.train_harnesses else None))
    eval_harnesses = args.eval_harnesses.split(",") if args.eval_harnesses else None
    if eval_harnesses is not None:
        unknown = [h for h in eval_harnesses if h not in envs.HARNESSES]
        if unknown:
            raise SystemExit(f"unknown harness(es) {unknown}: choose from {envs.HARNESSES}")

    def score(checkpoint: str, name: str) -> dict:
        return score_policy(checkpoint, name, str(tokenizer_path), held, effort, k=args.k, seed=args.eval_seed,
                            specs=grpo_cfg.efforts, harness=eval_harnesses)

    for phase in args.phases:
        if args.skip_control and phase in ("control", "eval_control"):
            continue  # --skip-control: no control arm at all, whatever --phases names
        if path_of(phase).exists():
            print(f"{phase}: done before ({path_of(phase)})", flush=True)
            continue
        for need in NEEDS.get(phase, ()):
            if not (args.skip_control and need in ("control", "eval_control")):
                read(need)
        t0 = time.perf_counter()
        print(f"{time.strftime('%H:%M:%S')} {phase} …", flush=True)
        if phase == "plan":
            out = {"header": run_header(), "args": vars(args), "policy": str(policy), "tokenizer": str(tokenizer_path),
                   "cell": args.cell, "families": families, "families_from": "ladder" if args.families is None else "--families",
                   "ladder_pass_rate": cell.pass_rate if cell else None, "ladder_in_band": cell.in_band if cell else None,
                   "ladder_families": cell.families if cell else None, "ladder_selected": cell.selected if cell else None,
                   "rl_tasks": [[t.family, t.seed] for t in rl], "heldout_tasks": [[t.family, t.seed] for t in held],
                   "grpo": asdict(grpo_cfg), "train_harnesses": train_harnesses,
                   "eval_harnesses": eval_harnesses or "training harnesses"}
            ladder = (f"ladder: {cell.selected} pass {cell.pass_rate:.2f}" if cell else "no ladder") + (
                "; --families overrides it" if args.families is not None else "")
            print(f"{args.cell}: {families} ({ladder}), {len(rl)} distinct RL prompts, "
                  f"{len(held)} distinct held-out tasks, policy {policy}", flush=True)
        elif phase == "eval_sft":
            from k3model.train import stats
            out = score(str(policy), "sft_policy")
            # The power of the pre-registered test at a true +15 points, from what was just measured.
            r = out["sampled"]["per_task"]
            p_greedy = sum(out["greedy"]["per_task"]) / len(held)
            headroom = 1 - sum(r) / (args.k * len(held))
            out["power"] = {
                "effect": 0.15, "min_gain": 0.10, "alpha": 0.05, "n": len(held),
                # No room for a +15 gain above sft_policy: the test cannot show one (power 0), say why.
                "pass1_bootstrap": stats.paired_mean_power(r, args.k, 0.15, min_gain=0.10, sims=400)
                if headroom >= 0.15 else 0.0,
                "greedy_mcnemar": stats.paired_power(p_greedy, 0.15, len(held), min_gain=0.10)
                if p_greedy <= 0.85 else None,
                **({} if headroom >= 0.15 else {"why": f"sft_policy pass@1 {1 - headroom:.3f} leaves {headroom * 100:.1f} "
                                                       "points, less than the +15 the test is powered at"})}
            print(f"power at +15 (rule: gain ≥ +10, lower bound > 0): {out['power']}", flush=True)
            if out["power"]["pass1_bootstrap"] < stats.POWER_TARGET:  # refused with the numbers, after the write
                write(phase, out)
                if "why" in out["power"]:  # more tasks would not help: the policy has no room to gain +15
                    raise SystemExit(f"{args.cell}: not trained — {out['power']['why']}")
                stats.require_power(out["power"]["pass1_bootstrap"], what=f"{args.cell} pass@1 bootstrap at +15",
                                    n=len(held))
        elif phase == "grpo":
            from k3model.train import stats
            power = read("eval_sft")["power"]
            if power["pass1_bootstrap"] < stats.POWER_TARGET:  # a rerun must not train a cell refused before
                raise SystemExit(f"{args.cell}: not trained — power {power['pass1_bootstrap']:.2f} at +15"
                                 + (f" ({power['why']})" if "why" in power else ""))
            from datagen.tokenizer import load_tokenizer
            from k3model.train.flops import counting
            from k3model.train.grpo import train

            def live(step: int, m: dict) -> None:
                print(args.cell, step, {k: round(float(v), 3) for k, v in m.items() if k.startswith(
                    ("rl/success", "rl/frac_zero", "rl/groups_drawn", "rl/policy_tokens", "perf/rollout_s",
                     "perf/update_s", "train/loss"))}, flush=True)

            with counting() as flops:
                result = train(grpo_cfg, str(policy), load_tokenizer(str(tokenizer_path)), work / "grpo_run",
                               domain=domain, effort=effort, tasks=[envs.generate(t.family, t.seed) for t in rl],
                               harnesses=train_harnesses, log_fn=live)
            hist = [{k: float(v) for k, v in h.items() if isinstance(v, (int, float)) or hasattr(v, "item")}
                    for h in result.history]
            episodes = sum(h.get("rl/groups_drawn", 0.0) for h in hist) * args.group_size
            kept = sum(h.get("rl/groups_kept", 0.0) for h in hist) * args.group_size
            trained_tokens = int(sum(h.get("rl/policy_tokens", 0.0) for h in hist))
            rollout_s = sum(h.get("perf/rollout_s", 0.0) for h in hist)
            update_s = sum(h.get("perf/update_s", 0.0) for h in hist)
            out = {"checkpoint": str(result.checkpoint_dir), "history": hist,
                   "metrics": {k: float(v) for k, v in result.metrics.items() if not isinstance(v, str)},
                   "flops": flops.as_dict(), "episodes": episodes, "episodes_kept": kept,
                   "trained_policy_tokens": trained_tokens,
                   "generated_policy_tokens": int(result.metrics.get("rl/episodes_tokens", 0)),
                   "reward_curve": [h.get("rl/success") for h in hist],
                   "frac_zero_variance": [h.get("rl/frac_zero_variance") for h in hist],
                   "rollout_s": rollout_s, "update_s": update_s, "episodes_per_rollout_s": episodes / max(rollout_s, 1e-9)}
            print(f"grpo: {episodes:.0f} episodes ({kept:.0f} in kept groups), {trained_tokens} trained policy tokens, "
                  f"rollout {rollout_s:.0f} s, update {update_s:.0f} s", flush=True)
        elif phase == "control":
            from datagen.tokenizer import load_tokenizer
            from k3model.checkpoint import read_manifest
            from k3model.train.sft import SFTConfig
            from k3model.train.sft_control import control_demos, train_control
            budget = read("grpo")["trained_policy_tokens"] if args.control_budget is None else args.control_budget
            sft_cfg = read_manifest(policy)["config"]["sft"]
            cfg = SFTConfig(profile=sft_cfg["profile"], qat=sft_cfg["qat"], qat_scale_rounding=sft_cfg["qat_scale_rounding"],
                            qat_scope=sft_cfg["qat_scope"], batch_size=args.control_batch, lr=args.control_lr,
                            seed=args.seed, log_every=50, steps=1)
            # Enough demonstrations that the budget is under ~2 epochs: low-effort rows hold ~20–60 own tokens.
            n_demo = max(64, min(4096, budget // 40 // len(families)))
            demos = control_demos(load_tokenizer(str(tokenizer_path)), families, effort, n_demo, exclude=held,
                                  seed=args.control_data_seed)

            def live(step: int, m: dict) -> None:
                print("control", step, {k: round(float(v), 4) for k, v in m.items() if k in ("train/main", "train/lr")},
                      flush=True)

            result = train_control(cfg, demos, budget, policy, work / "control_run", live)
            out = {"checkpoint": str(result.checkpoint_dir), "config": asdict(replace(cfg, steps=int(result.metrics["control/steps"]))),
                   "budget_tokens": budget, "tokens_seen": result.tokens_seen, "rows": demos.num_rows,
                   "demo_tasks_per_family": n_demo, "metrics": {k: float(v) for k, v in result.metrics.items()},
                   "loss_curve": [float(h["train/main"]) for h in result.history if "train/main" in h]}
            print(f"control: {result.tokens_seen} labelled tokens (budget {budget}) in "
                  f"{int(result.metrics['control/steps'])} steps on {demos.num_rows} rows", flush=True)
        elif phase == "eval_specialist":
            out = score(read("grpo")["checkpoint"], "specialist")
        elif phase == "eval_control":
            out = score(read("control")["checkpoint"], "control")
        else:
            out = report(args, read, held)
        out["phase_wall_s"] = time.perf_counter() - t0
        write(phase, out)
        print(f"{time.strftime('%H:%M:%S')} {phase} done in {out['phase_wall_s']:.0f} s", flush=True)


def report(args, read, held) -> dict:
    """The three arms side by side, the paired comparisons and the verdicts; the result JSON."""
    from k3model.train import stats
    plan, sft, grpo = read("plan"), read("eval_sft"), read("grpo")
    control = None if args.skip_control else read("control")
    arms = {"sft_policy": sft, "specialist": read("eval_specialist")}
    if control is not None:
        arms["control"] = read("eval_control")
    k = args.k
    rows = {name: arm_row(a, k) for name, a in arms.items()}
    pairs = (("specialist", "sft_policy"), ("control", "sft_policy"), ("specialist", "control"))
    powered = sft["power"]["pass1_bootstrap"] >= stats.POWER_TARGET
    comparisons = {f"{new}_vs_{base}": compare_arms(arms[new], arms[base], k, powered)
                   for new, base in pairs if new in arms and base in arms}
    header = run_header()
    out = {"header": header, "plan_header": plan["header"], "args": vars(args), "cell": plan["cell"],
           "families": plan["families"], "ladder_pass_rate": plan["ladder_pass_rate"], "policy": plan["policy"],
           "n_rl_prompts": len(plan["rl_tasks"]), "n_heldout": len(held), "grpo_config": plan["grpo"],
           "arms": rows, "comparisons": comparisons, "power": sft["power"],
           "grpo": {k_: v for k_, v in grpo.items() if k_ != "history"}, "grpo_history": grpo["history"],
           "control": control,
           "wall_s": {"eval_sft": sft["phase_wall_s"], "grpo": grpo["phase_wall_s"],
                      "eval_specialist": arms["specialist"]["phase_wall_s"]}}
    if control is not None:
        out["wall_s"].update(control=control["phase_wall_s"], eval_control=arms["control"]["phase_wall_s"])
    path = dated_result("posttrain", f"grpo_powered_{args.label}", out)
    print(f"| arm | pass@1 (T=1, k={k}) | greedy | pass@{k} | n |")
    for name, r in rows.items():
        print(f"| {name} | {r['pass1']:.3f} | {r['greedy']:.3f} | {r[f'pass{k}']:.3f} | {r['n']} |")
    for name, c in comparisons.items():
        g = c["pass1"]
        print(f"{name}: pass@1 {g['gain'] * 100:+.1f} [{g['lo'] * 100:+.1f}, {g['hi'] * 100:+.1f}] p {g['p']:.4f} "
              f"({g['verdict']}, gate +15 {'yes' if g['gate_15'] else 'no'}); greedy "
              f"{c['greedy']['gain'] * 100:+.1f} [{c['greedy']['lo'] * 100:+.1f}, {c['greedy']['hi'] * 100:+.1f}]; "
              f"pass@{k} {c[f'pass{k}']['gain'] * 100:+.1f}")
    print(f"power at +15: {sft['power']} → {path}", flush=True)
    return {"result": str(path)}


if __name__ == "__main__":
    main()
