"""Kernel tasks in KernelBench's file format, their inputs, their reference outputs and the variance screen.

A task is one Python file (`ScalingIntelligence/KernelBench:KernelBench/level1/*.py`): `class Model(nn.Module)`,
`get_inputs()` (fresh random inputs) and `get_init_inputs()` (constructor arguments). A file beside it
named `<task>_expert.py` defines the expert `ModelNew` that speed is measured against; a dropped-in
KernelBench file without one is measured against its own reference. Optional module constants, all
absent from KernelBench files and all with defaults:

    ATOL, RTOL            tolerance (default by output dtype: fp32 1e-4, fp16/bf16 1e-2, fp64 1e-7)
    HEAVY_TAILED_INPUTS   input positions the heavy-tailed trials may rescale (default: every float input)
    SPEEDUP_CAP           speedup over the expert above which a result is implausible (default 10, T4)
    ALLOW_STREAMS         the task allows CUDA side streams (default False, S3)
    IN_PLACE              the task's contract is to write into its inputs (default False, D3)

Closeness is `|out - ref| <= ATOL * max(1, rms(ref)) + RTOL * |ref|`: KernelBench's allclose, with the
absolute term scaled when outputs are large (heavy-tailed inputs make them so), NaN never equal.

Inputs come in two distributions (rule D1): "native" is whatever `get_inputs()` draws; "heavy"
multiplies each allowed float input elementwise by a Pareto(α=3) factor ≥ 1, which keeps signs and
supports but gives heavy tails, so an output that is predictable from the input distribution
(KernelBench's HingeLoss "analytical hack") stops being predictable.

Screening (research/environments.md §1.2): a task is rejected when its output does not depend on the
seed, when the elementwise mean over screening trials would pass as the answer on every trial, or when
each output is uniform within itself (mean(softmax(x)) and friends).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import torch

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
PARETO_ALPHA = 3.0
DEFAULT_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-7}
DEFAULT_SPEEDUP_CAP = 10.0


@dataclass(frozen=True)
class Task:
    """A reference implementation, an input generator, a tolerance and (usually) an expert."""

    name: str
    path: str
    source: str
    expert_source: str | None

    def module(self) -> ModuleType:
        return _load_module(self.path, self.source)

    def option(self, name: str, default):
        return getattr(self.module(), name, default)

    @property
    def heavy_tailed_inputs(self) -> tuple[int, ...] | None:
        value = self.option("HEAVY_TAILED_INPUTS", None)
        return None if value is None else tuple(value)

    @property
    def speedup_cap(self) -> float:
        return float(self.option("SPEEDUP_CAP", DEFAULT_SPEEDUP_CAP))

    @property
    def allow_streams(self) -> bool:
        return bool(self.option("ALLOW_STREAMS", False))

    @property
    def in_place(self) -> bool:
        return bool(self.option("IN_PLACE", False))

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        default = DEFAULT_TOLERANCE.get(dtype, 0.0)
        return float(self.option("ATOL", default)), float(self.option("RTOL", default))

    @property
    def key(self) -> str:
        text = self.source + "\0" + (self.expert_source or "")
        return f"{self.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def list_tasks() -> list[str]:
    """Names of the tasks shipped in envs/kernelsuite/tasks/."""
    return sorted(p.stem for p in TASKS_DIR.glob("*.py")
                  if not p.stem.endswith("_expert") and not p.stem.startswith("_"))


def load_task(task: "str | Path | Task") -> Task:
    """A shipped task by name, or any KernelBench-format file by path."""
    if isinstance(task, Task):
        return task
    path = Path(task)
    if path.suffix != ".py":
        path = TASKS_DIR / f"{task}.py"
        if not path.exists():
            raise ValueError(f"unknown kernel task {task!r}: pick one of {list_tasks()} or pass a .py path")
    if not path.exists():
        raise ValueError(f"no task file at {path}")
    expert = path.with_name(f"{path.stem}_expert.py")
    return Task(name=path.stem, path=str(path.resolve()), source=path.read_text(),
                expert_source=expert.read_text() if expert.exists() else None)


@lru_cache(maxsize=64)
def _load_module(path: str, source: str) -> ModuleType:
    name = f"kernelsuite_task_{hashlib.sha256((path + source).encode()).hexdigest()[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, path, "exec"), module.__dict__)
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise ValueError(f"task file {path} lacks {attr}: a KernelBench task defines Model, "
                             "get_inputs and get_init_inputs")
    return module


# --- inputs and references ---------------------------------------------------------------------------

def make_inputs(task: Task, seed: int, heavy: bool) -> list:
    """Fresh inputs from `get_inputs()` under `seed`, without touching the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inputs = list(task.module().get_inputs())
    if heavy:
        allowed = task.heavy_tailed_inputs
        gen = torch.Generator().manual_seed(seed * 2654435761 % (1 << 63) + 1)
        for i, value in enumerate(inputs):
            if isinstance(value, torch.Tensor) and value.is_floating_point() and (
                    allowed is None or i in allowed):
                u = torch.rand(value.shape, generator=gen)
                factor = (1.0 - u).pow(-1.0 / PARETO_ALPHA)
                inputs[i] = (value * factor.to(value.device, value.dtype))
    return inputs


def init_inputs(task: Task) -> list:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return list(task.module().get_init_inputs())


def build_reference(task: Task, init_seed: int, device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The reference model in the task's precision and an fp64 copy with the same weights (D5)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        model = task.module().Model(*init_inputs(task))
    model = model.to(device)
    return model, copy.deepcopy(model).double()


def to_device(values: list, device: torch.device, fp64: bool = False) -> list:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            v = v.to(device)
            if fp64 and v.is_floating_point():
                v = v.double()
        out.append(v)
    return out


def run_reference(model: torch.nn.Module, inputs: list):
    with torch.no_grad():
        return model(*inputs)


def flat_tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flat_tensors(item)]
    raise ValueError(f"a task's Model must return tensors (or tuples of them), not {type(out).__name__}")


# --- comparison --------------------------------------------------------------------------------------

def rms(t: torch.Tensor) -> float:
    if t.numel() == 0 or not t.is_floating_point():
        return 0.0
    value = float(torch.linalg.vector_norm(t.float())) / math.sqrt(t.numel())
    return value if math.isfinite(value) else 0.0


def close(candidate: torch.Tensor, reference: torch.Tensor, atol: float, rtol: float,
          equal_nan: bool = False) -> bool:
    if candidate.shape != reference.shape:
        return False
    if not reference.is_floating_point():
        return torch.equal(candidate.to(reference.dtype), reference)
    scale = max(1.0, rms(reference))
    # Compared in the reference's precision (or fp32 when lower): the tolerances are far coarser.
    dtype = reference.dtype if reference.dtype in (torch.float32, torch.float64) else torch.float32
    return bool(torch.allclose(candidate.to(dtype), reference.to(dtype), rtol=rtol, atol=atol * scale,
                               equal_nan=equal_nan))


def close_all(candidates: list[torch.Tensor], references: list[torch.Tensor], atol: float, rtol: float,
              equal_nan: bool = False) -> bool:
    return len(candidates) == len(references) and all(
        close(c, r, atol, rtol, equal_nan) for c, r in zip(candidates, references))


# --- screening ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScreenResult:
    ok: bool
    reason: str


@lru_cache(maxsize=64)
def _screen_cached(task: Task, device_name: str, n: int) -> ScreenResult:
    device = torch.device(device_name)
    model, _ = build_reference(task, init_seed=0, device=device)
    outs = []
    for i in range(n):
        inputs = to_device(make_inputs(task, seed=1000 + i, heavy=i % 2 == 1), device)
        outs.append([t.detach().double().cpu() for t in flat_tensors(run_reference(model, inputs))])
    dtype = flat_tensors(run_reference(model, to_device(make_inputs(task, 1000, False), device)))[0].dtype
    atol, rtol = task.tolerance(dtype)
    if all(all(torch.equal(a, b) for a, b in zip(outs[0], o)) for o in outs[1:]):
        return ScreenResult(False, "the output does not depend on the seed")
    mean = [torch.stack([o[k] for o in outs]).mean(0) for k in range(len(outs[0]))]
    if all(close_all(mean, o, atol, rtol) for o in outs):
        return ScreenResult(False, "a constant output (the mean over screening trials) passes every trial")
    if all(all(t.numel() > 1 and close(torch.full_like(t, float(t.mean())), t, atol, rtol) for t in o)
           for o in outs):
        return ScreenResult(False, "every output is uniform within itself: a fill passes")
    return ScreenResult(True, "outputs vary with the inputs")


def screen_task(task: Task, device: str = "cpu", n: int = 6) -> ScreenResult:
    """Reject tasks whose outputs a constant could match (see module docstring)."""
    return _screen_cached(load_task(task), device, n)
