"""`KernelEnv`: the kernel suite as a text-in/text-out RL environment (the "coding_agents" domain).

    env = KernelEnv()
    prompt = env.reset(task="softmax", seed=3)
    obs, reward, terminated, truncated, info = env.step(policy_text)   # text holds a ```python block
    blob = env.snapshot(); last_obs = env.restore(blob)                  # pause / resume an episode
    record = envs.rollout(env, policy)                                   # the core envs' loop works too

The protocol is the core envs' one (`envs.env.Env`): `reset` returns the first observation, `step`
the Gymnasium 5-tuple, `restore` the last observation, `trajectory()` the episode record; calling
`step` before `reset` or after the end raises RuntimeError.

The prompt shows the task file and asks for a `ModelNew`; the policy's reply is scanned for fenced
Python blocks and the last one that defines `class ModelNew` is evaluated (`evaluate.evaluate`). The
reward is that evaluation's reward (0 on any hacking rule, tagged `hack:<rule>` in `info["tags"]`).
An episode ends (`terminated`) at the first correct submission or the first flagged one; otherwise
the feedback comes back as the next observation until `max_turns` replies have been scored
(`truncated`). Evaluation seeds derive from (episode seed, turn), so a restored episode scores a
given reply exactly as the uninterrupted one would (up to timing noise in the speedup).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field

from .evaluate import EvalConfig, evaluate
from .rules import RULES
from .task import list_tasks, load_task

_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
SNAPSHOT_VERSION = 1

PROMPT = """You are optimizing a PyTorch model by writing a faster implementation of it.

The reference implementation (task `{name}`):

```python
{source}
```

Write a Python module that defines `class ModelNew(nn.Module)` with the same constructor arguments
and the same `forward` signature as `Model`, computing the same outputs (tolerance atol={atol:g},
rtol={rtol:g}) as fast as you can on {device}. Backend: {backend}. Parameters are created under the
same random seed as the reference's, so create them in the same order and with the same calls.
Your code runs in a sandbox on fresh random inputs and is timed against an expert implementation.
It scores zero if a hacking rule fires; among them: no try/except, no threads, no timer or library
patching, no reading files or interpreter internals, no caching of outputs, no lower precision than
fp32, no graph replay, no tensor subclasses, and do not modify the inputs.

Answer with the whole module in one ```python block."""


def extract_submission(text: str) -> str | None:
    """The last fenced Python block that defines ModelNew (or the last Python block at all)."""
    blocks = _BLOCK.findall(text)
    for block in reversed(blocks):
        if re.search(r"^class\s+ModelNew\b", block, re.MULTILINE):
            return block
    return blocks[-1] if blocks else None


@dataclass(frozen=True)
class KernelEnvConfig:
    tasks: tuple[str, ...] = ()                     # empty: every shipped task
    max_turns: int = 1
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(isolation="zygote"))

    def __post_init__(self):
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        known = set(list_tasks())
        for name in self.tasks:
            if name not in known and not name.endswith(".py"):
                raise ValueError(f"unknown kernel task {name!r}: pick from {sorted(known)} or a .py path")


class KernelEnv:
    """Gymnasium-shaped, in the core envs' convention: reset → obs; step → (obs, reward, terminated,
    truncated, info). `seed` seeds the draw of episode seeds when reset() is called without one."""

    def __init__(self, config: KernelEnvConfig | None = None, seed: int = 0):
        self.config = config or KernelEnvConfig()
        self.state: dict | None = None
        self._rng = random.Random(seed)

    @property
    def task_names(self) -> list[str]:
        return list(self.config.tasks) or list_tasks()

    @property
    def done(self) -> bool:
        return self.state is not None and self.state["done"]

    def reset(self, task: str | None = None, seed: int | None = None) -> str:
        """Start an episode on `task` (default: task `seed mod n`); returns the prompt."""
        if seed is None:
            seed = self._rng.randrange(2**31)
        if task is not None and not isinstance(task, str):
            raise ValueError(f"task must be a kernel task name or a .py path, not {type(task).__name__}")
        name = task or self.task_names[seed % len(self.task_names)]
        load_task(name)
        self.state = {"task": name, "seed": int(seed), "turn": 0, "done": False, "history": []}
        self.state["last_observation"] = self._prompt()
        return self.state["last_observation"]

    def _prompt(self) -> str:
        task = load_task(self.state["task"])
        cfg = self.config.eval
        device = "a GPU" if cfg.device == "cuda" else "the machine's device (a CPU when no GPU is present)"
        backend = {"any": "any (PyTorch, NumPy, or Triton kernels)", "triton": "Triton kernels required",
                   "cuda": "inline CUDA (torch.utils.cpp_extension.load_inline) required"}[cfg.backend]
        atol, rtol = task.tolerance(_output_dtype(task))
        return PROMPT.format(name=task.name, source=task.source.strip(), atol=atol, rtol=rtol,
                             device=device, backend=backend)

    def step(self, text: str):
        if self.state is None:
            raise RuntimeError("call reset() before step()")
        if self.state["done"]:
            raise RuntimeError("the episode is over; call reset() to start another")
        state = self.state
        state["turn"] += 1
        source = extract_submission(text)
        if source is None:
            record = {"turn": state["turn"], "source_sha256": None, "correct": False, "speedup": 0.0,
                      "reward": 0.0, "rules_fired": []}
            obs = "No ```python block was found in your answer; put the whole module in one."
            info = {"error": "no_submission"}
        else:
            result = evaluate(state["task"], source, seed=state["seed"] * 1009 + state["turn"],
                              config=self.config.eval)
            record = {"turn": state["turn"], "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
                      "correct": result.correct, "speedup": result.speedup, "reward": result.reward,
                      "rules_fired": result.rules_fired}
            obs = result.summary()
            info = {"correct": result.correct, "speedup": result.speedup,
                    "rules_fired": result.rules_fired, "tags": result.tags, "details": result.details}
        state["history"].append(record)
        terminated = bool(record["correct"] or record["rules_fired"])
        truncated = not terminated and state["turn"] >= self.config.max_turns
        state["done"] = terminated or truncated
        if not state["done"]:
            obs += "\n\nRevise your implementation and answer with the whole module again."
        state["last_observation"] = obs
        return obs, float(record["reward"]), terminated, truncated, info

    def snapshot(self) -> bytes:
        if self.state is None:
            raise RuntimeError("call reset() before snapshot()")
        return json.dumps({"version": SNAPSHOT_VERSION, "state": self.state,
                           "rng": self._rng.getstate()}, sort_keys=True).encode()

    def restore(self, blob: bytes) -> str:
        """Continue the episode saved in `blob`; returns its last observation."""
        try:
            data = json.loads(blob)
        except ValueError as exc:
            raise ValueError(f"not a KernelEnv snapshot ({exc})") from None
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version {data.get('version')} is not {SNAPSHOT_VERSION}")
        load_task(data["state"]["task"])
        self.state = data["state"]
        version, internal, gauss = data["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        return self.state["last_observation"]

    def trajectory(self) -> dict:
        """The episode so far: task, seed, one record per scored reply, the total reward."""
        if self.state is None:
            raise RuntimeError("call reset() before trajectory()")
        history = self.state["history"]
        return {"env": "kernelsuite", "task": self.state["task"], "seed": self.state["seed"],
                "turns": [dict(r) for r in history], "done": self.state["done"],
                "reward": sum(r["reward"] for r in history)}

    @staticmethod
    def rules() -> dict[str, str]:
        return dict(RULES)


def _output_dtype(task):
    import torch

    from .task import build_reference, flat_tensors, make_inputs, run_reference

    model, _ = build_reference(task, init_seed=0, device=torch.device("cpu"))
    return flat_tensors(run_reference(model, make_inputs(task, 0, heavy=False)))[0].dtype
