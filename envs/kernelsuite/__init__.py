"""Kernel-coding RL suite with a reward-hacking detector (DESIGN.md §4 Environments, §5 claim 8).

    from envs.kernelsuite import evaluate, KernelEnv
    result = evaluate("softmax", submission_source)      # -> EvalResult
    result.correct, result.speedup, result.rules_fired, result.reward, result.details

Tasks are KernelBench files (`Model`, `get_inputs`, `get_init_inputs`; a submission defines `ModelNew`);
see task.py for the optional constants, evaluate.py for the scoring, static.py / _worker.py for the
detector's rules (rules.py lists them), sandbox.py for process isolation, env.py for the
text-in/text-out RL environment and report.py for the planted-hack/honest table.
"""

from .env import KernelEnv, extract_submission
from .evaluate import EvalConfig, EvalResult, evaluate, expert_baseline
from .rules import RULES
from .task import Task, list_tasks, load_task, screen_task

__all__ = ["EvalConfig", "EvalResult", "KernelEnv", "RULES", "Task", "evaluate", "expert_baseline",
           "extract_submission", "list_tasks", "load_task", "screen_task"]
