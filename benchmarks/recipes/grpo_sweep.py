"""One RL specialist cell against sft_policy on held-out tasks: the GRPO sweep of issue 18 item 7.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/recipes/grpo_sweep.py --home /work/rl-home \
        --cell general_agents/low --steps 16 --lr 1e-3 --label ga_low_s16

Each run trains one specialist as the `rl_specialist` asset does, through the same library calls:
`k3model.train.grpo.train` from the home's sft_policy on the cell's RL prompts (the families the
home's `rl_tasks` ladder selected, seeds from `recipes.RL_SEED_BASE`), then the specialist and
sft_policy scored the same way (`k3model.train.evaluate.evaluate`, tiny's `SpecialistEval`) on the
same held-out tasks (`ladder.heldout_tasks`: seeds from `recipes.EVAL_SEED_BASE`, any task whose
prompt equals an RL prompt's skipped) and the specialist on the domain's hard split
(`ladder.hard_tasks`). Budgets per effort are the
tiny profile's (`k3model.train.recipes.POSTTRAIN_SIZES["tiny"].eval_budgets`). Unset options take the tiny row's
values, so a run with no options measures what `make run` does.

The gain is claim 3's: Newcombe's 95 % interval of the difference of the two success rates
(`k3model.train.stats.newcombe`), which treats the n episodes as independent — so score one episode
per task (`--eval-samples 1`) with many tasks, not k samples of few tasks.

Writes benchmarks/results/posttrain/<date>_grpo_sweep_<label>.json (header, config, the reward
curve, both evaluations, the gain, wall times). The machine is shared: say in the log how loaded it was.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.common import ROOT, run_header


def latest(path: Path, pattern: str) -> Path:
    """The newest match of `pattern` under `path` (checkpoints and data sit in run-id folders)."""
    found = sorted(path.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"nothing matches {path}/{pattern}: materialize it first (README: k3 run)")
    return found[-1]


def main() -> None:
    from datagen.tokenizer import load_tokenizer
    from k3model.checkpoint import load_model
    from k3model.train.effort import effort_specs
    from k3model.train.evaluate import evaluate
    from k3model.train.grpo import GRPOConfig, train
    from k3model.train.ladder import LadderReport, hard_tasks, heldout_tasks, tasks_of
    from k3model.train.recipes import POSTTRAIN_SIZES as SIZES, RL_SEED_BASE, SpecialistEval
    from k3model.train.stats import newcombe

    tiny = SIZES["tiny"]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--home", required=True, help="a K3_HOME holding tiny's sft_policy, rl_tasks, tokenizer")
    ap.add_argument("--cell", required=True, help="domain/effort, e.g. general_agents/low")
    ap.add_argument("--steps", type=int, default=tiny.rl_steps)
    ap.add_argument("--lr", type=float, default=tiny.rl_lr)
    ap.add_argument("--group-size", type=int, default=tiny.rl_group_size)
    ap.add_argument("--groups", type=int, default=tiny.rl_groups_per_step, help="informative groups per step")
    ap.add_argument("--negative-scale", type=float, default=GRPOConfig().negative_scale)
    ap.add_argument("--warmup-frac", type=float, default=GRPOConfig().warmup_frac,
                    help="linear lr warmup over max(⌊warmup_frac · steps⌋, 1) steps")
    ap.add_argument("--max-draw-factor", type=int, default=tiny.rl_max_draw_factor)
    ap.add_argument("--rl-tasks", type=int, default=tiny.rl_tasks_per_family, help="RL prompts per family")
    ap.add_argument("--eval-tasks", type=int, default=tiny.rl_eval_tasks_per_family,
                    help="held-out tasks per family")
    ap.add_argument("--eval-samples", type=int, default=tiny.rl_eval_samples)
    ap.add_argument("--eval-temperature", type=float, default=tiny.rl_eval_temperature)
    ap.add_argument("--hard-tasks", type=int, default=tiny.rl_hard_tasks)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", required=True)
    ap.add_argument("--work", default="/tmp/grpo_sweep")
    args = ap.parse_args()

    home = Path(args.home)
    domain, effort = args.cell.split("/")
    policy = latest(home / "checkpoints/tiny/sft_policy", "*/manifest.json").parent
    tokenizer = latest(home / "data/tiny/tokenizer", "*/tokenizer.json")
    ladder = LadderReport.from_json(json.loads(latest(home / "data/tiny/rl_tasks", "*/ladder.json").read_text()))
    families = ladder.cell(domain, effort).selected
    rl = tasks_of(families, args.rl_tasks, RL_SEED_BASE)
    held = heldout_tasks(families, args.eval_tasks, exclude=rl)
    specs = effort_specs(tiny.eval_budgets)
    cfg = replace(GRPOConfig(steps=args.steps, group_size=args.group_size, groups_per_step=args.groups,
                             lr=args.lr, seed=args.seed, warmup_frac=args.warmup_frac, negative_scale=args.negative_scale, max_draw_factor=args.max_draw_factor),
                  **({"efforts": specs} if specs else {}))
    work = Path(args.work) / f"{args.label}_{time.strftime('%H%M%S')}"
    header = run_header()
    print(f"{args.cell}: {families}, {len(rl)} RL prompts, {len(held)} held-out tasks, policy {policy}", flush=True)

    def live(step: int, metrics: dict) -> None:
        print(args.cell, step, {k: round(v, 3) for k, v in metrics.items() if isinstance(v, float) and k.startswith(
            ("rl/success", "rl/frac_zero", "rl/groups_kept", "rl/tokens", "perf/", "eval/success"))}, flush=True)

    t0 = time.perf_counter()
    tok = load_tokenizer(tokenizer)
    r = train(cfg, policy, tok, work, domain=domain, effort=effort, tasks=rl, log_fn=live)
    scoring = SpecialistEval(args.eval_temperature, args.eval_samples, args.hard_tasks)
    t_eval = time.perf_counter()
    scored = {}
    for name, ckpt, tasks in (("specialist", r.checkpoint_dir, held), ("sft_policy", policy, held),
                              ("specialist_hard", r.checkpoint_dir, hard_tasks(domain, scoring.hard_tasks))):
        scored[name] = evaluate(load_model(ckpt)[0].eval(), tok, tasks, effort, samples=scoring.samples,
                                temperature=scoring.temperature, seed=scoring.seed, specs=cfg.efforts,
                                max_episodes_per_batch=cfg.max_episodes_per_batch).as_metadata()
    seconds = time.perf_counter() - t0
    mine, sft = scored["specialist"], scored["sft_policy"]
    gain, lo, hi = newcombe(mine["successes"], mine["n"], sft["successes"], sft["n"])
    out = {"header": header, "args": vars(args), "policy": str(policy), "families": families,
           "rl_tasks": len(rl), "heldout_tasks": len(held), "grpo": asdict(cfg), "seconds": seconds,
           "train_seconds": t_eval - t0,
           "gain": {"gain": gain, "lo": lo, "hi": hi, "specialist": mine["success_rate"], "sft": sft["success_rate"],
                    "n": mine["n"]},
           "reward_curve": [h.get("rl/success") for h in r.history],
           "frac_zero_variance": [h.get("rl/frac_zero_variance") for h in r.history],
           "history": r.history,
           "specialist": mine, "sft_policy": sft, "specialist_hard": scored["specialist_hard"],
           "metrics": r.metrics}
    date = datetime.date.today().isoformat()
    path = Path(ROOT) / "benchmarks/results/posttrain" / f"{date}_grpo_sweep_{args.label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"{args.cell} {args.label}: specialist {mine['success_rate']:.3f} vs sft {sft['success_rate']:.3f} "
          f"(n {mine['n']}), gain {gain * 100:+.1f} [{lo * 100:+.1f}, {hi * 100:+.1f}]; tokens "
          f"{mine['mean_policy_tokens']:.0f} vs {sft['mean_policy_tokens']:.0f}; {seconds:.0f} s → {path}", flush=True)


if __name__ == "__main__":
    main()
