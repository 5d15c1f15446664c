"""The paired held-out evaluation of post-training arms (issue 40 items 4–5, issue 41): every arm —
sft_policy, a specialist, a control, a distilled student — plays the same held-out tasks with the same
sampling seeds, k episodes per task at temperature 1 (pass@1 = mean successes / k, pass@k = share of
tasks with a success) and one greedy episode per task; episode j of task i draws the same uniforms
whichever policy plays it, so arms are compared task by task.

`score_policy` plays and records one arm; `arm_row` summarises it; `compare_arms` is claim 3's test of
one arm against another (the paired percentile bootstrap over tasks, `stats.paired_bootstrap`; greedy by
exact McNemar); `compare_not_worse` is its hard split's (max not worse than low by a margin). The recipes under benchmarks/recipes/ (`grpo_powered`, `mopd_powered`,
`transfer_powered`, `powered`) write these records as JSON phases.
"""

from __future__ import annotations

import time

from k3model.train import stats


def score_policy(checkpoint: str, name: str, tokenizer_path: str, held: list, effort: str, *, k: int, seed: int,
                 specs, harness: str | list[str] | None = None) -> dict:
    """k episodes per held-out task at temperature 1 and one greedy episode per task, the generator seed
    the same for every arm (episode j of task i draws the same uniforms whichever policy plays it);
    `harness` as `evaluate` takes it (None: the training harnesses, round-robin over the tasks)."""
    from datagen.tokenizer import load_tokenizer
    from k3model.checkpoint import load_model
    from k3model.train.evaluate import evaluate
    model = load_model(checkpoint)[0].eval()
    tok = load_tokenizer(tokenizer_path)
    out = {"checkpoint": checkpoint}
    for way, samples, temperature in (("sampled", k, 1.0), ("greedy", 1, 0.0)):
        t0 = time.perf_counter()
        r = evaluate(model, tok, held, effort, samples=samples, temperature=temperature, seed=seed, specs=specs,
                     harness=harness, max_episodes_per_batch=64)
        wall = time.perf_counter() - t0
        out[way] = {"per_task": [r.per_task[t.id] for t in held], "metadata": r.as_metadata(), "wall_s": wall,
                    "episodes_per_s": r.n / wall}
        print(f"{name} {way}: success {r.success_rate:.3f} (n {r.n}), {r.mean_policy_tokens:.0f} tokens/episode, "
              f"{wall:.0f} s", flush=True)
    return out


def arm_row(a: dict, k: int) -> dict:
    """One scored arm's pass@1 (T = 1, k samples), pass@k, greedy success, n and tokens per episode."""
    s, g = a["sampled"]["per_task"], a["greedy"]["per_task"]
    return {"pass1": sum(s) / (k * len(s)), f"pass{k}": sum(x > 0 for x in s) / len(s), "greedy": sum(g) / len(g),
            "n": len(s), "tokens_sampled": a["sampled"]["metadata"]["mean_policy_tokens"],
            "tokens_greedy": a["greedy"]["metadata"]["mean_policy_tokens"],
            "eval_wall_s": a["sampled"]["wall_s"] + a["greedy"]["wall_s"]}


def compare_arms(a: dict, b: dict, k: int, powered: bool) -> dict:
    """Arm a − arm b on the same tasks and seeds: pass@1 by the paired bootstrap with claim 3's rule
    (gain ≥ +10 points, lower bound > 0) and the gate (≥ +15), pass@k by the same bootstrap, greedy by
    exact McNemar. `powered`: the test's power at +15 reached 0.8 (else the verdict reads "underpowered")."""
    gain, lo, hi, p = stats.paired_bootstrap([x / k for x in a["sampled"]["per_task"]],
                                             [x / k for x in b["sampled"]["per_task"]], resamples=10_000, seed=0)
    gk, lok, hik, pk = stats.paired_bootstrap([float(x > 0) for x in a["sampled"]["per_task"]],
                                              [float(x > 0) for x in b["sampled"]["per_task"]], resamples=10_000, seed=0)
    gb, gc, gn = stats.paired_counts(dict(enumerate(a["greedy"]["per_task"])), dict(enumerate(b["greedy"]["per_task"])))
    gd, glo, ghi = stats.paired_difference(gb, gc, gn)
    rule = bool(gain >= 0.10 - 1e-12 and lo > 0)
    return {"pass1": {"gain": gain, "lo": lo, "hi": hi, "p": p, "claim3_rule": rule, "gate_15": bool(gain >= 0.15 - 1e-12),
                      "verdict": ("pass" if rule else "fail") if powered else "underpowered"},
            f"pass{k}": {"gain": gk, "lo": lok, "hi": hik, "p": pk},
            "greedy": {"gain": gd, "lo": glo, "hi": ghi, "b": gb, "c": gc, "n": gn, "p": stats.mcnemar_exact(gb, gc)}}


def compare_not_worse(a: dict, b: dict, k: int, margin: float, powered: bool) -> dict:
    """Arm a − arm b on the same tasks and seeds, judged as "a is not worse than b": pass when the paired
    bootstrap's 95 % lower bound of the pass@1 difference exceeds −margin (claim 3's hard split: max ≥ low,
    margin pre-registered); greedy by exact McNemar beside it. `powered`: the test's power (a truly equal,
    `stats.noninferiority_power`) reached 0.8, else the verdict reads "underpowered"."""
    d, lo, hi, p = stats.paired_bootstrap([x / k for x in a["sampled"]["per_task"]],
                                          [x / k for x in b["sampled"]["per_task"]], resamples=10_000, seed=0)
    gb, gc, gn = stats.paired_counts(dict(enumerate(a["greedy"]["per_task"])), dict(enumerate(b["greedy"]["per_task"])))
    gd, glo, ghi = stats.paired_difference(gb, gc, gn)
    holds = bool(lo > -margin)
    return {"pass1": {"difference": d, "lo": lo, "hi": hi, "p": p, "margin": margin, "holds": holds,
                      "verdict": ("pass" if holds else "fail") if powered else "underpowered"},
            "greedy": {"difference": gd, "lo": glo, "hi": ghi, "b": gb, "c": gc, "n": gn, "p": stats.mcnemar_exact(gb, gc)}}
