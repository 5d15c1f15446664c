"""The Ray tasks of the distillation assets (assets/distill.py): no Dagster import, so a Ray worker
loads only the library. Each is `task(*args, work_dir, live) -> result` for `assets.training`.

- `train_mopd_task`: `k3model.train.mopd.train` on the rl_tasks ladder's prompts, then the student on
  each distilled (domain, effort) cell's held-out tasks, the ones each teacher was evaluated on; the
  teacher-retention matrix (student ÷ teacher success, Katz 95 % interval) from them; optionally
  the equal-compute generalist GRPO control (`k3model.train.control`), evaluated on the same cells.
- `train_transfer_arm_task`: one arm of one cross-harness fold (`k3model.train.grpo.train` on the
  arm's harnesses), evaluated in those harnesses and in the fold's held-out one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from assets.ray_task import LiveLog, load_on_task_device


def retention(student: dict[str, dict], teachers: dict[str, dict]) -> dict[str, dict]:
    """Per "domain/effort" cell: student and teacher success, their ratio and its 95 % interval."""
    from k3model.train.transfer import ratio_interval
    out = {}
    for cell, t in teachers.items():
        s = student[cell]
        ratio, lo, hi = ratio_interval(s["successes"], s["n"], t["successes"], t["n"])
        out[cell] = {"student": s["success_rate"], "teacher": t["success_rate"], "n": s["n"],
                     "retention": ratio, "ci95_low": lo, "ci95_high": hi,
                     "student_tokens": s["mean_policy_tokens"], "teacher_tokens": t["mean_policy_tokens"]}
    return out


@dataclass
class StudentResult:
    checkpoint_dir: Path
    history: list[dict]
    metrics: dict[str, float]
    evals: dict[str, dict]  # the student, every cell
    teacher_evals: dict[str, dict]  # each teacher on its own cell
    retention: dict[str, dict]
    teacher_manifest: dict[str, dict]
    flops: dict[str, float]
    control: dict | None = None  # the equal-compute generalist: flops, budget, evals, turns
    resumed_from_step: int | None = None


def train_mopd_task(cfg, student_checkpoint: str, teachers: dict[str, str], tokenizer_path: str,
                    cells: dict[str, dict], specs, teacher_figures: dict[str, dict], control_cfg,
                    specialist_flops: float | None, scoring, work_dir: str, live: LiveLog) -> StudentResult:
    """MOPD from sft_policy with `teachers` ("domain|effort" → checkpoint; the routes of `cfg`, all nine
    or a subset) on each cell's RL prompts
    (`cells[pk]["rl"]`, the rl_tasks ladder's (family, seed) pairs), then the student on each cell's
    held-out tasks (`cells[pk]["eval"]`, `specs` budgets), scored as each specialist was
    (`scoring`, a k3model.train.recipes.SpecialistEval: temperature, samples per task, seed) — the same tasks,
    budgets and decoding, so student ÷ teacher compares like with like. A teacher's figures come from `teacher_figures[pk]` (its own
    materialization's evaluation) or, when absent, are measured here on the same tasks. With
    `control_cfg` (a GRPOConfig) and the specialists' counted FLOPs, the generalist control is
    trained on specialists + MOPD FLOPs and evaluated on the same cells."""
    import envs
    from datagen.tokenizer import load_tokenizer
    from k3model.train.evaluate import evaluate
    from k3model.train.mopd import evaluate_routes, train

    def generate(pairs) -> list:
        return [envs.generate(f, s) for f, s in pairs]

    def play(checkpoint: str, pk: str) -> dict:  # a teacher without its own figures, on its cell
        effort = pk.split("|")[1]
        return evaluate(load_on_task_device(checkpoint), tokenizer, generate(cells[pk]["eval"]), effort,
                        samples=scoring.samples, temperature=scoring.temperature, seed=scoring.seed,
                        specs=specs).as_metadata()

    def on_cells(model) -> dict[str, dict]:
        """`model` on every distilled cell's held-out tasks. Greedy single episodes decode the cells
        in batches (evaluate_routes: the nine are three decodes; the same figures as evaluate per cell); sampled
        scoring goes through evaluate per cell, exactly as the specialists were scored."""
        if scoring.temperature == 0 and scoring.samples == 1:
            return {"/".join(route): report.as_metadata()
                    for route, report in evaluate_routes(model, tokenizer, cell_tasks, specs).items()}
        return {"/".join(route): evaluate(model, tokenizer, ts, route[1], samples=scoring.samples,
                                          temperature=scoring.temperature, seed=scoring.seed,
                                          specs=specs).as_metadata()
                for route, ts in cell_tasks.items()}

    tokenizer = load_tokenizer(tokenizer_path)
    routes = {tuple(k.split("|")): v for k, v in teachers.items()}
    tasks = {tuple(k.split("|")): generate(c["rl"]) for k, c in cells.items()}
    result = train(cfg, student_checkpoint, routes, tokenizer, work_dir, tasks=tasks, log_fn=live)
    t0 = time.perf_counter()
    student = load_on_task_device(str(result.checkpoint_dir))
    cell_tasks = {tuple(pk.split("|")): generate(cells[pk]["eval"]) for pk in teachers}
    evals = on_cells(student)
    teacher_evals = {pk.replace("|", "/"): teacher_figures.get(pk) or play(ckpt, pk) for pk, ckpt in teachers.items()}
    kept = retention(evals, teacher_evals)
    headline = {"eval/success_rate": sum(e["success_rate"] for e in evals.values()) / max(len(evals), 1),
                "perf/eval_wall_s": time.perf_counter() - t0}
    ratios = [r["retention"] for r in kept.values() if r["retention"] is not None]
    if ratios:
        headline["eval/retention_min"] = min(ratios)
    control = None
    if control_cfg is not None and specialist_flops:
        from k3model.train.control import generalist_control
        budget = specialist_flops + result.flops["total"]
        ctl = generalist_control(control_cfg, student_checkpoint, tokenizer, Path(work_dir) / "control",
                                 flop_budget=budget, routes=list(routes), tasks=tasks, log_fn=live)
        control = {"flops": ctl.flops, "budget": budget, "turns": ctl.turns,
                   "evals": on_cells(load_on_task_device(str(ctl.checkpoint_dir)))}
        headline["control/success_rate"] = (sum(e["success_rate"] for e in control["evals"].values())
                                            / max(len(control["evals"]), 1))
    live(cfg.steps, headline)
    return StudentResult(Path(result.checkpoint_dir), result.history, {**result.metrics, **headline}, evals,
                         teacher_evals, kept, result.teacher_manifest, result.flops, control, result.resumed_from_step)


@dataclass
class ArmResult:
    checkpoint_dir: Path
    history: list[dict]
    metrics: dict[str, float]
    arm: object  # k3model.train.transfer.Arm
    resumed_from_step: int | None = None


def evaluate_sft_transfer_task(policy_checkpoint: str, tokenizer_path: str, folds: tuple[str, ...], effort: str,
                               eval_tasks: list[tuple[str, int]], eval_specs) -> dict:
    """`k3model.train.transfer.evaluate_sft`; tasks travel as (family, seed) pairs."""
    import envs
    from datagen.tokenizer import load_tokenizer
    from k3model.train.transfer import evaluate_sft

    return evaluate_sft(policy_checkpoint, load_tokenizer(tokenizer_path), folds, effort=effort,
                        eval_tasks=[envs.generate(f, s) for f, s in eval_tasks], eval_specs=eval_specs)


def train_transfer_arm_task(cfg, policy_checkpoint: str, tokenizer_path: str, name: str, domain: str, effort: str,
                            harnesses: tuple[str, ...], held_out: str, rl_tasks: list[tuple[str, int]],
                            eval_tasks: list[tuple[str, int]], eval_specs, work_dir: str, live: LiveLog) -> ArmResult:
    """`k3model.train.transfer.train_arm`; tasks travel as (family, seed) pairs."""
    import envs
    from datagen.tokenizer import load_tokenizer
    from k3model.train.transfer import train_arm

    arm = train_arm(cfg, policy_checkpoint, load_tokenizer(tokenizer_path), work_dir, name=name, harnesses=harnesses,
                    held_out=held_out, domain=domain, effort=effort,
                    eval_tasks=[envs.generate(f, s) for f, s in eval_tasks],
                    train_tasks=[envs.generate(f, s) for f, s in rl_tasks], eval_specs=eval_specs, log_fn=live)
    live(cfg.steps, {"eval/in_harness_success": arm.in_harness["success_rate"],
                     "eval/held_out_success": arm.held_out["success_rate"]})
    return ArmResult(arm.checkpoint_dir, arm.history, arm.train_metrics, arm)
