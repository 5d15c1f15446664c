"""Rollout and evaluation throughput of `k3model.train.rollout.play_tasks` against the engine's own
raw batched decode at the same batch size, in the same run.

    nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/decode/rollout.py --profile tiny \
        --out benchmarks/results/posttrain/2026-12-05_rollout_tiny_cpu.json

Three workloads, interleaved over `--reps` repetitions (the 2-core machine is shared: the load is in
the header, and the ratios are the figures):
- `rl`: an RL step's rollouts: `--tasks` tasks × `--group` samples at temperature 1, turns of at
  most `--turn-tokens`, episodes of at most `--budget` generated tokens (the envs' own step limits
  also end episodes);
- `eval`: held-out evaluation: `--tasks` × `--group` tasks, one greedy episode each, same budgets;
- `raw`: `engine.prefill` of `--concurrent` prompts of the mean first-observation length, then
  `engine.decode` of the mean generated tokens per episode at temperature 1, no stop ids (every row
  decodes to the end: the engine's ceiling at that batch size).

Per workload: episodes/s, generated tokens/s (tokens the model sampled), and core-seconds
(getrusage user + system of this process and its reaped children: the sandboxed commands of the
coding envs) per episode. `rl_vs_raw` = rollout generated tokens/s ÷ raw tokens/s (prefill of the
same first-observation length + decode, end to end), `*_core` the same per core-second, and
`rl_vs_decode_only` against the decode loop alone.

The model is randomly initialised (no trained tiny checkpoint here): decoding cost does not depend
on the weights, episode lengths do — a random policy never writes a valid call nor its stop id, so
its turns would all run to `--turn-tokens` and its episodes to the budget or the env's step limit.
A trained policy's turns end where it writes its stop id, so lengths vary, and that is what
continuous batching is for: the top `--stop-frac` of the vocabulary also ends a turn (at temperature
1, a turn then ends at each token with probability ≈ stop-frac). Fixed max tokens, in the JSON. Text: `rollout.sft_format` at `--effort` on the profile's tokenizer
(trained from its corpus at the start, ~9 s at tiny), harnesses in rotation (`--harnesses`).
`raw` reports end to end (prefill + decode, `generated_tokens_per_s`) and decode only.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import traceback

import torch

from benchmarks.common import close_report, run_header, write_json


def core_seconds() -> float:
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def token_format(profile: str, effort: str):
    """The conversation format RL and evaluation use (`rollout.sft_format`), on the profile's
    tokenizer trained here from its corpus (a few seconds at tiny)."""
    from datagen.corpus import build_corpus
    from datagen.profiles import presets
    from datagen.tokenizer import train_tokenizer
    from k3model.train.rollout import sft_format
    cfg = presets(profile)
    return sft_format(train_tokenizer(cfg.tokenizer, build_corpus(cfg.corpus)), effort)


def run_episodes(model, fmt, tasks, harnesses, args, temperature: float, samples: int, seed: int) -> dict:
    from k3model.engine import SamplingConfig
    from k3model.train.rollout import play_tasks
    V = model.cfg.vocab_size
    # A random policy's turns all run to the cap; a trained one's end where it stops. Extra stop ids
    # (the top --stop-frac of the vocabulary) make turn and episode lengths vary the same way.
    stops = tuple(range(V - round(args.stop_frac * V), V))
    cfg = SamplingConfig(max_new_tokens=args.turn_tokens, temperature=temperature, stop_ids=stops)
    generator = torch.Generator().manual_seed(seed)
    c0, t0 = core_seconds(), time.perf_counter()
    played = play_tasks(model, fmt, tasks, harnesses, cfg, samples=samples,
                        episode_budget=args.budget, generator=generator,
                        max_episodes_per_batch=args.concurrent)
    wall, cores = time.perf_counter() - t0, core_seconds() - c0
    episodes = [ep for _, _, ep in played]
    generated = sum(ep.n_generated for ep in episodes)
    first = [ep.turns[0].start for ep in episodes if ep.turns]
    return {"episodes": len(episodes), "wall_s": round(wall, 3), "core_s": round(cores, 3),
            "episodes_per_s": len(episodes) / wall, "generated_tokens_per_s": generated / wall,
            "core_s_per_episode": cores / len(episodes), "generated_tokens": generated,
            "generated_per_episode": generated / len(episodes), "generated_tokens_per_core_s": generated / cores,
            "generated_per_episode_min_max": [min(ep.n_generated for ep in episodes),
                                              max(ep.n_generated for ep in episodes)],
            "tokens_per_episode": sum(len(ep.token_ids) for ep in episodes) / len(episodes),
            "turns_per_episode": sum(len(ep.turns) for ep in episodes) / len(episodes),
            "first_observation_mean": sum(first) / max(1, len(first)),
            "stop_reasons": {r: sum(ep.stop_reason == r for ep in episodes) for r in
                             sorted({ep.stop_reason for ep in episodes})}}


def sync(model) -> None:
    """Wait for the GPU's queued work, so a wall time covers it."""
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()


def run_raw(model, batch: int, prompt_len: int, new: int, seed: int) -> dict:
    from k3model.engine import SamplingConfig, decode, prefill
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, model.cfg.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(batch)]
    cfg = SamplingConfig(max_new_tokens=new, temperature=1.0)
    c0, t0 = core_seconds(), time.perf_counter()
    with torch.no_grad():
        cache, logits_BV = prefill(model, prompts, new)
        sync(model)
        t1, c1 = time.perf_counter(), core_seconds()
        # Sampling draws on the model's device (a CUDA multinomial takes a CUDA generator).
        g_dev = torch.Generator(device=logits_BV.device).manual_seed(seed)
        done, _ = decode(model, cache, logits_BV, [cfg] * batch, [new] * batch, generator=g_dev)
    wall, cores = time.perf_counter() - t0, core_seconds() - c0
    decode_s, decode_core_s = time.perf_counter() - t1, core_seconds() - c1
    tokens = sum(len(c.token_ids) for c in done)
    return {"batch": batch, "prompt": prompt_len, "new": new, "wall_s": round(wall, 3), "core_s": round(cores, 3),
            "generated_tokens_per_s": tokens / wall, "generated_tokens_per_core_s": tokens / cores,
            "decode_only_tokens_per_s": tokens / decode_s, "decode_only_tokens_per_core_s": tokens / decode_core_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--domains", default="general_tasks,general_agents,coding_agents")
    ap.add_argument("--harnesses", default="hermes,codex,claude_code")
    ap.add_argument("--effort", default="high", help="the effort tag of the conversation format")
    ap.add_argument("--tasks", type=int, default=32, help="distinct tasks per workload (× --group episodes)")
    ap.add_argument("--group", type=int, default=4, help="RL samples per task (evaluation plays this many tasks more)")
    ap.add_argument("--concurrent", type=int, default=64)
    ap.add_argument("--turn-tokens", type=int, default=256, help="max new tokens a turn (tiny's low effort)")
    ap.add_argument("--budget", type=int, default=128,
                    help="generated tokens an episode may spend (make run's RL episodes averaged 117)")
    ap.add_argument("--stop-frac", type=float, default=0.02,
                    help="this fraction of the vocabulary (its top ids) also ends a turn: variable lengths")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: bf16 weights, rollouts through the "
                    "captured decode step (engine.SlotBatch)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    report = {"header": run_header(), "args": vars(args),
              "model": "randomly initialised (seed 0), fp32, eval; episode lengths fixed by the budgets",
              "format": "rollout.sft_format on the profile's tokenizer (trained here)"}
    t_start = time.perf_counter()
    error = None
    try:
        import envs
        import k3model
        # Which library ran (PYTHONPATH may point at another checkout: a before/after comparison).
        report["k3model_path"] = os.path.dirname(os.path.abspath(k3model.__file__))
        from k3model.config import get_profile
        from k3model.model import K3Model
        torch.manual_seed(0)
        model = K3Model(get_profile(args.profile).model).eval()
        if args.device == "cuda":
            model = model.cuda().to(torch.bfloat16)
            report["model"] = report["model"].replace("fp32", "bf16 on CUDA")
        fmt = token_format(args.profile, args.effort)
        domains, harness_list = args.domains.split(","), args.harnesses.split(",")
        per = -(-args.tasks // len(domains))
        rl_tasks = [t for d in domains for t in envs.task_set(d, per, seed=0)][: args.tasks]
        ev_tasks = [t for d in domains for t in envs.task_set(d, per * args.group, seed=10_000)][: args.tasks * args.group]
        rl_h = [harness_list[i % len(harness_list)] for i in range(len(rl_tasks))]
        ev_h = [harness_list[i % len(harness_list)] for i in range(len(ev_tasks))]
        runs = {"rl": [], "eval": [], "raw": []}
        for rep in range(args.reps):
            runs["rl"].append(run_episodes(model, fmt, rl_tasks, rl_h, args, 1.0, args.group, rep))
            runs["eval"].append(run_episodes(model, fmt, ev_tasks, ev_h, args, 0.0, 1, rep))
            rl = runs["rl"][-1]
            runs["raw"].append(run_raw(model, args.concurrent, max(4, round(rl["first_observation_mean"])),
                                       max(1, round(rl["generated_per_episode"])), rep))
            print({k: {m: v[-1][m] for m in ("wall_s", "core_s", "generated_tokens_per_s")} for k, v in runs.items()},
                  flush=True)
        report["runs"] = runs
        best = {k: max(v, key=lambda r: r["generated_tokens_per_s"]) for k, v in runs.items()}
        report["summary"] = {
            "rl_core_s_per_episode_median": statistics.median(r["core_s_per_episode"] for r in runs["rl"]),
            "eval_core_s_per_episode_median": statistics.median(r["core_s_per_episode"] for r in runs["eval"]),
            "rl_episodes_per_s_best": best["rl"]["episodes_per_s"],
            "eval_episodes_per_s_best": best["eval"]["episodes_per_s"],
            "rl_generated_tokens_per_s_best": best["rl"]["generated_tokens_per_s"],
            "eval_generated_tokens_per_s_best": best["eval"]["generated_tokens_per_s"],
            "raw_decode_tokens_per_s_best": best["raw"]["generated_tokens_per_s"],
            "rl_vs_raw": [r["generated_tokens_per_s"] / w["generated_tokens_per_s"]
                          for r, w in zip(runs["rl"], runs["raw"])],
            "eval_vs_raw": [r["generated_tokens_per_s"] / w["generated_tokens_per_s"]
                            for r, w in zip(runs["eval"], runs["raw"])],
            # The same ratios in core-seconds (the shared machine's load moves wall time the most),
            # and against the decode loop alone (no prefill: a ceiling rollouts cannot reach, since
            # they also read every observation).
            "rl_vs_raw_core": [r["generated_tokens_per_core_s"] / w["generated_tokens_per_core_s"]
                               for r, w in zip(runs["rl"], runs["raw"])],
            "eval_vs_raw_core": [r["generated_tokens_per_core_s"] / w["generated_tokens_per_core_s"]
                                 for r, w in zip(runs["eval"], runs["raw"])],
            "rl_vs_decode_only": [r["generated_tokens_per_s"] / w["decode_only_tokens_per_s"]
                                  for r, w in zip(runs["rl"], runs["raw"])],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        }
        print(report["summary"], flush=True)
    except Exception:
        error = traceback.format_exc()
    return close_report(report, t_start, lambda: write_json(args.out, report), error)


if __name__ == "__main__":
    sys.exit(main())
