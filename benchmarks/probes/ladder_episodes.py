"""Why a policy fails a word-copy rung: the ladder's episodes of echo_word and slack_ping, sorted.

    python benchmarks/probes/ladder_episodes.py --policy SFT_CHECKPOINT_DIR --tokenizer TOKENIZER_JSON \
        [--families slack_ping,echo_word] [--tasks 4] [--samples 8] [--out result.json]

Plays each family's ladder tasks (`k3model.train.ladder.tasks_of`, RL seeds 0 …) at every effort the
way `rl_tasks` measures them (8 samples at temperature 1, the tiny profile's episode budgets, the
training harnesses round-robin over the tasks) and sorts each episode by what its first answer
holds, read from the call's JSON arguments (every training harness writes JSON):

- slack_ping: the `text` and `channel` of the first post: word right / another word of the
  starter list / other text; channel right / wrong; no post at all;
- echo_word: the finish answer: right / another starter word / other.

Prints one table per family and effort, and a few failing calls verbatim.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter

from k3model.train.recipes import POSTTRAIN_SIZES as SIZES
from k3model.train.effort import effort_specs
from datagen.tokenizer import load_tokenizer
from envs.tasks.starter import WORDS
from k3model.checkpoint import load_model
from k3model.train.evaluate import resolve_harnesses
from k3model.train.effort import EFFORTS
from k3model.train.ladder import tasks_of
from k3model.engine import SamplingConfig
from k3model.train.rollout import play_tasks, sft_format

import torch

ARG = r'\\?"{key}\\?"\s*:\s*\\?"([^"\\]*)'


def first_arg(actions: list[str], key: str) -> str | None:
    for text in actions:
        m = re.search(ARG.format(key=key), text)
        if m:
            return m.group(1)
    return None


def classify(family: str, spec: dict, actions: list[str]) -> str:
    if family == "slack_ping":
        text = first_arg(actions, "text")
        if text is None:
            return "no post"
        word = ("word right" if text.strip() == spec["text"] else
                "other starter word" if text.strip() in WORDS else "other text")
        channel = first_arg(actions, "channel")
        return f"{word}, channel {'right' if channel == spec['channel'] else 'wrong'}"
    answer = first_arg(actions, "answer") or first_arg(actions, "result")
    if answer is None:
        return "no answer"
    return ("word right" if answer.strip() == spec["answer"] else
            "other starter word" if answer.strip() in WORDS else "other text")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--families", default="slack_ping,echo_word")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=3, help="failing calls printed per family and effort")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, _ = load_model(args.policy)
    model.eval()
    tok = load_tokenizer(args.tokenizer)
    specs = effort_specs(SIZES["tiny"].eval_budgets)
    out: dict = {}
    for family in args.families.split(","):
        tasks = tasks_of([family], args.tasks, 0)
        for effort in EFFORTS:
            spec = specs[effort]
            gen = torch.Generator().manual_seed(args.seed)
            played = play_tasks(model, sft_format(tok, effort), tasks, resolve_harnesses(len(tasks), None),
                                SamplingConfig(max_new_tokens=spec.turn_tokens, temperature=1.0),
                                samples=args.samples, episode_budget=spec.budget_tokens, generator=gen)
            counts: Counter = Counter()
            shown = 0
            for i, harness, ep in played:
                rec = ep.record or {"steps": []}
                actions = [s["action"] for s in rec["steps"]]
                kind = "success" if ep.reward > 0 else classify(family, tasks[i].spec, actions)
                counts[kind] += 1
                if kind != "success" and shown < args.show:
                    shown += 1
                    print(f"  [{family}/{effort} {harness} seed {tasks[i].seed}: {tasks[i].instruction!r}] "
                          f"{kind}: {actions[:1]!r}")
            n = len(played)
            print(f"{family} {effort}: " + ", ".join(f"{k} {v}/{n}" for k, v in counts.most_common()))
            out[f"{family}/{effort}"] = dict(counts)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "counts": out}, f, indent=1)


if __name__ == "__main__":
    main()
