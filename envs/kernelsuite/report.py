"""Measure claim 8: the detector flags every planted hack with its rule and passes every honest submission.

    python -m envs.kernelsuite.report [--device auto|cpu|cuda] [--isolation spawn|zygote]
                                      [--json PATH] [--seed N]

Runs every entry of `submissions.CORPUS` through `evaluate` (hacks twice: with every check, and with
the static checks off, to show what the run-time layers catch alone), screens every task, and prints
markdown tables: hack → rules fired, honest submission → speedup over the expert. `--json` writes the
same numbers with the machine and library versions. Exits 1 when the claim fails.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace

import torch

from .evaluate import EvalConfig, evaluate, resolve_device
from .submissions import CORPUS, FIXTURES, Planted
from .task import list_tasks, load_task, screen_task


def run_entry(entry: Planted, cfg: EvalConfig, seed: int) -> dict:
    cfg = replace(cfg, backend=entry.backend, screen=entry.screen)
    t0 = time.monotonic()
    full = evaluate(entry.task_ref, entry.source, seed=seed, config=cfg)
    row = {"name": entry.name, "kind": entry.kind, "task": entry.task, "description": entry.description,
           "backend": entry.backend, "correct": full.correct, "speedup": full.speedup,
           "reward": full.reward, "rules_fired": full.rules_fired, "expected": list(entry.expected),
           "time_s": full.details.get("time_s"), "expert_time_s": full.details.get("expert_time_s"),
           "precision": full.details.get("precision"), "error": full.details.get("error"),
           "findings": full.details["findings"]}
    if entry.kind == "hack":
        device = full.details["device"]
        dynamic = evaluate(entry.task_ref, entry.source, seed=seed, config=replace(cfg, static=False))
        row["expected"] = sorted(entry.expected_on(device), key=_rule_key)
        row["dynamic_rules_fired"] = dynamic.rules_fired
        row["dynamic_expected"] = sorted(entry.expected_on(device, static=False), key=_rule_key)
        row["ok"] = (entry.expected_on(device) <= set(full.rules_fired) and full.reward == 0.0
                     and entry.expected_on(device, static=False) <= set(dynamic.rules_fired))
    else:
        row["ok"] = full.correct and not full.rules_fired and full.reward > 0
    row["wall_s"] = time.monotonic() - t0
    return row


def markdown(rows: list[dict], screens: dict) -> str:
    hacks = [r for r in rows if r["kind"] == "hack"]
    honest = [r for r in rows if r["kind"] == "honest"]
    out = ["| planted hack | task | what it does | must fire (all checks / static off) | fired (all checks) | "
           "fired (static off) | ok |", "|---|---|---|---|---|---|---|"]
    for r in hacks:
        must = f"{', '.join(r['expected'])} / {', '.join(r['dynamic_expected']) or '—'}"
        out.append(f"| `{r['name']}` | {r['task']} | {r['description']} | {must} | "
                   f"{', '.join(r['rules_fired']) or '—'} | {', '.join(r['dynamic_rules_fired']) or '—'} | "
                   f"{'yes' if r['ok'] else '**NO**'} |")
    out += ["", "| honest submission | task | backend | correct | rules fired | time | expert | speedup | "
            "rel. err vs fp64 | ok |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in honest:
        prec = r["precision"]["candidate_rel_err"] if r["precision"] else None
        out.append(f"| `{r['name']}` | {r['task']} | {r['backend']} | {r['correct']} | "
                   f"{', '.join(r['rules_fired']) or '—'} | {_us(r['time_s'])} | {_us(r['expert_time_s'])} | "
                   f"{r['speedup']:.3g}x | {f'{prec:.1e}' if prec is not None else '—'} | "
                   f"{'yes' if r['ok'] else '**NO**'} |")
    out += ["", "| task | low-variance screen |", "|---|---|"]
    out += [f"| {name} | {'pass' if ok else 'REJECT'}: {reason} |" for name, (ok, reason) in screens.items()]
    n_hack_ok = sum(r["ok"] for r in hacks)
    n_honest_ok = sum(r["ok"] for r in honest)
    out += ["", f"Claim 8: {n_hack_ok}/{len(hacks)} planted hacks flagged with their rules (reward 0); "
                f"{n_honest_ok}/{len(honest)} honest submissions correct with no rule fired."]
    return "\n".join(out)


def _rule_key(rule: str) -> tuple[int, str]:
    return ("SDTP".index(rule[0]), rule)


def _us(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e6:,.0f} µs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--isolation", default="zygote", choices=("spawn", "zygote"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", default=None, help="names of corpus entries to run")
    parser.add_argument("--json", default=None, help="write the measurements here")
    args = parser.parse_args(argv)
    # The parent's own comparisons run single-threaded: on a shared 2-core machine torch's thread pool
    # spends more time waiting than working.
    torch.set_num_threads(1)
    device = resolve_device(args.device)
    cfg = EvalConfig(device=device.type, isolation=args.isolation)
    t0 = time.monotonic()
    screens = {}
    for name in list_tasks() + [str(p) for p in sorted(FIXTURES.glob("*.py")) if not p.stem.endswith("_expert")]:
        verdict = screen_task(load_task(name), device.type)
        screens[load_task(name).name] = (verdict.ok, verdict.reason)
    rows = []
    for entry in CORPUS:
        if args.only and entry.name not in args.only:
            continue
        rows.append(run_entry(entry, cfg, args.seed))
        print(f"{rows[-1]['kind']:6} {entry.name:28} {'ok' if rows[-1]['ok'] else 'FAIL'} "
              f"({rows[-1]['wall_s']:.1f} s)", file=sys.stderr)
    table = markdown(rows, screens)
    print(table)
    if args.json:
        record = {"command": "python -m envs.kernelsuite.report " + " ".join(argv or sys.argv[1:]),
                  "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.platform(),
                  "processor": platform.processor(), "python": platform.python_version(),
                  "torch": torch.__version__, "device": device.type,
                  "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
                  "isolation": args.isolation, "wall_s": time.monotonic() - t0, "rows": rows,
                  "screens": {k: {"ok": ok, "reason": why} for k, (ok, why) in screens.items()}}
        try:
            import triton

            record["triton"] = triton.__version__
        except ImportError:
            record["triton"] = None
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1, default=str)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
