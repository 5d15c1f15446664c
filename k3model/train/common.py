"""What every trainer shares: optimizer, autocast, the clipped step, MoE balancing, resume, metrics.

Pretraining (`k3model.train.pretrain`), its data-parallel step (`k3model.parallel.data_parallel`), SFT
(`k3model.train.sft`) and RL (`k3model.train.grpo`) stand on these pieces instead of restating them
(torchtitan's `components/`, nanochat's `common.py`):

- `LoopConfig`: the fields every trainer's config shares (seed, steps, lr, the warmup + cosine
  schedule, weight decay, clipping, checkpoint and log cadence), validated once; `SFTConfig`,
  `GRPOConfig`, `MOPDConfig`, `DraftTrainConfig` and `PretrainConfig` extend it (trl's
  `GRPOConfig(TrainingArguments)`). One schedule for all: linear warmup over
  max(⌊warmup_frac · steps⌋, 1) steps, then cosine to min_lr_ratio · lr (`schedule.lr_at`).
- `Loop`: the frame of every `train()` around its step: the resume point `out_dir/last`, the step
  range a resumed or `stop_after` run covers, the metric buffer, logging and checkpointing at the
  configured cadence, and the final checkpoint `out_dir/final`.
- `build_optimizer`: AdamW, β = (0.9, 0.95), weight decay on matrices only — norms, biases,
  pseudo-queries and gate scalars (every 1-D parameter) are not decayed; PyTorch's fused kernel on CUDA.
  Or Per-Head Muon on the hidden matrices with that AdamW on the rest (`k3model.train.muon`).
- `autocast_for(device)`: bf16 autocast on CUDA, none on the CPU (fp32 there: the CPU's bf16 matmuls
  are slower and the tiny profiles are not memory-bound).
- `optimizer_step`: zero grads → backward (of one loss, or of each micro-batch's as it comes) →
  optional gradient reduce (the data-parallel all-reduce) → clip by the global norm → step; returns
  the pre-clip norm as a tensor (no host sync).
- `balance_experts`: each LatentMoE's load ratio max/mean of the last forward, then its bias update
  (`update_bias`), optionally with the loads and histograms summed over ranks first.
- `attention_logits`: each MLA head's max attention logit of the last forward, and QK-Clip.
- `save_state` / `resume` / `load_weights` / `restore_train_state`: a checkpoint directory
  with the full train state (optimizer, RNG, whatever the loop keeps) around `k3model.checkpoint`, so
  a killed run called again resumes and ends where an uninterrupted one would.
- `CapturedStep`: a whole step captured in one CUDA graph and replayed (fixed shapes, state kept in place).
- `MetricBuffer`: keeps each step's metrics as tensors and reads them to the host in one transfer
  when the loop logs or checkpoints (`log_and_checkpoint`), so a step never waits on the device
  (nanoGPT, nanochat).

Only torch is imported at module level: the data-parallel step imports this module on machines that
have nothing else (DESIGN.md §7); checkpoint I/O (safetensors) is imported when it is used.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn as nn

from k3model.schedule import lr_at

if TYPE_CHECKING:
    from k3model.checkpoint import TrainState

logger = logging.getLogger(__name__)

Reduce = Callable[[nn.Module], None]
Clip = Callable[[nn.Module, float], torch.Tensor]


OPTIMIZERS = ("adamw", "muon")


def build_optimizer(model: nn.Module, lr: float, weight_decay: float,
                    betas: tuple[float, float] = (0.9, 0.95), optimizer: str = "adamw") -> torch.optim.Optimizer:
    """AdamW; no decay on norms, biases, pseudo-queries and gate scalars (1-D parameters).
    `optimizer="muon"`: Per-Head Muon on the hidden matrices and this AdamW on the rest, at the same
    learning rate (`k3model.train.muon`).

    Fused on CUDA and on the CPU: one kernel for the whole update instead of a loop of small ops per
    tensor (a fraction of the time on the tiny model; docs/log/tiny.md), the same update within float
    rounding."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if optimizer == "muon":
        from k3model.train.muon import build_muon
        return build_muon(model, lr, weight_decay, betas)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    fused = bool(params) and params[0].device.type in ("cpu", "cuda")
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas, fused=fused)


@dataclass(frozen=True)
class LoopConfig:
    """What every training loop is configured with. A trainer's config extends it and redeclares a
    field only to change its default (GRPO: a few steps at a constant lr). `steps` and `lr` may be
    None where the trainer takes them from elsewhere (pretraining: the profile's stage)."""
    seed: int = 0
    steps: int | None = 200
    lr: float | None = 1e-3
    warmup_frac: float = 0.05  # linear warmup over max(⌊warmup_frac · steps⌋, 1) steps
    min_lr_ratio: float = 0.1  # the cosine ends at min_lr_ratio · lr (1: constant after the warmup)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    ckpt_every: int = 0  # resume point every this many steps; 0: four times per run
    log_every: int = 10

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value}")
        self.require_positive("log_every")
        if self.steps is not None:
            self.require_positive("steps")
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.warmup_frac <= 1.0:
            raise ValueError(f"warmup_frac must lie in [0, 1] (1: warm up over the whole run), got {self.warmup_frac}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be ≥ 0, got {self.weight_decay}")
        if self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip}")
        if self.ckpt_every < 0:
            raise ValueError(f"ckpt_every must be ≥ 0 (0: four resume points per run), got {self.ckpt_every}")

    def require_positive(self, *names: str) -> None:
        """ValueError unless each named count is ≥ 1 (a subclass checks its own counts with it)."""
        for name in names:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")

    def warmup_steps(self, steps: int) -> int:
        return max(int(self.warmup_frac * steps), 1)

    def lr_at(self, step: int, steps: int | None = None, lr: float | None = None) -> float:
        """The learning rate of 0-based `step` of `steps` (default: the config's) peaking at `lr`."""
        steps = steps or self.steps
        return lr_at(step, steps, lr or self.lr, self.warmup_steps(steps), self.min_lr_ratio)


class Loop:
    """The frame of a trainer's `train()` around its step:

        loop = Loop(cfg, out_dir, log_fn, stop_after=stop_after)   # seeds torch with cfg.seed
        ...build the model...
        run = loop.resume(model)                  # weights and train state of out_dir/last, if any
        ...build the optimizer, restore_train_state(run.state, optimizer) when resumed...
        for step in loop.steps():                 # from the resume point; stops early at stop_after
            ...one step...
            loop.end_step(step, metrics, save, tokens=...)   # buffer, log, resume point
        if loop.stopped: return …(loop.last_dir, …)
        save(cfg.steps, loop.final_dir, …)

    `save(step, directory, with_state)` is the trainer's (its manifest is its own)."""

    def __init__(self, cfg: LoopConfig, out_dir: str | Path, log_fn: Callable[[int, dict], None] | None, *,
                 steps: int | None = None, seed: int | None = None, stop_after: int | None = None):
        self.cfg = cfg
        self.total = steps or cfg.steps
        self.out_dir = Path(out_dir)
        self.last_dir = self.out_dir / "last"
        self.final_dir = self.out_dir / "final"
        self.log = log_fn or (lambda step, metrics: None)
        self.ckpt_every = cfg.ckpt_every or max(self.total // 4, 1)
        self.stop_after = stop_after
        self.stopped = False
        self.run = Resumed(None)
        self.buffer: MetricBuffer | None = None
        torch.manual_seed(cfg.seed if seed is None else seed)

    def resume(self, model: nn.Module) -> Resumed:
        self.run = resume(model, self.last_dir, self.log)
        return self.run

    def steps(self) -> Iterator[int]:
        """The 0-based steps left; a `stop_after` run stops after that many with its metrics flushed."""
        self.buffer = MetricBuffer()
        for step in range(self.run.step, self.total):
            if self.stop_after is not None and step >= self.run.step + self.stop_after:
                self.run.history.extend(self.buffer.flush())
                self.stopped = True
                return
            yield step

    def end_step(self, step: int, metrics: dict, save: Callable[[int, Path, bool], None], *, tokens: int = 0,
                 check: Callable[[list[dict]], None] | None = None) -> None:
        """Buffer step `step`'s metrics; log and write the resume point at the configured cadence."""
        self.buffer.append(metrics, tokens)
        log_and_checkpoint(step + 1, self.total, self.cfg.log_every, self.ckpt_every, self.buffer, self.run.history,
                           self.log, lambda done: save(done, self.last_dir, True), check)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


_logged_autocast: set[str] = set()


def autocast_for(device: str | torch.device, *, captured: bool = False) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; on the CPU a disabled autocast (the step runs in fp32). `captured`: the
    region captures CUDA graphs that outlive it (the rollouts' decode step, engine.GraphStep), so
    autocast's cache of cast weights is off: a graph then casts the live fp32 weights at every replay
    (an optimizer step is seen) instead of reading a cached copy that is stale, and freed when the
    region ends."""
    device_type = torch.device(device).type
    if device_type not in _logged_autocast:
        _logged_autocast.add(device_type)
        logger.info("model steps on %s: %s", device_type,
                    "bf16 autocast" if device_type == "cuda" else "fp32, no autocast")
    if device_type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not captured)
    return torch.autocast("cpu", enabled=False)


def _clip_local(model: nn.Module, max_norm: float) -> torch.Tensor:
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor | Iterable[torch.Tensor],
                   grad_clip: float, reduce: Reduce | None = None, clip: Clip = _clip_local) -> torch.Tensor:
    """zero_grad → loss.backward() → reduce(model) → clip(model, grad_clip) → optimizer.step().

    `loss` is one tensor, or an iterable of micro-batch losses (a generator that runs each
    micro-batch's forward when asked): each is backpropagated as it comes, so one micro-batch's graph
    is alive at a time and the gradients add up — each loss must carry its share of the batch's
    normalisation. `reduce` averages gradients over data-parallel ranks (None: one process); `clip`
    returns the norm before clipping (default: torch's, over this process's gradients).
    """
    optimizer.zero_grad(set_to_none=True)
    for part in (loss,) if isinstance(loss, torch.Tensor) else loss:
        part.backward()
    if reduce is not None:
        reduce(model)
    grad_norm = clip(model, grad_clip)
    optimizer.step()
    return grad_norm


def moe_layers(model: nn.Module) -> list[nn.Module]:
    from k3model.moe import LatentMoE
    return [m for m in model.modules() if isinstance(m, LatentMoE)]


def balance_experts(model: nn.Module, reduce_loads: Callable[[torch.Tensor], None] | None = None,
                    sync: Callable[[nn.Module], None] | None = None) -> dict[str, torch.Tensor]:
    """Update every LatentMoE's routing bias from the forwards since the last call (after the
    optimizer step); returns the load ratio max_j / mean_j of the last forward, mean and worst over
    layers (tensors). `reduce_loads` sums the [layers, experts] loads over ranks in place; `sync(moe)`
    sums one layer's balancing statistics over ranks before its update."""
    moes = moe_layers(model)
    if not moes:
        return {}
    device = next(model.parameters()).device
    loads_NE = torch.stack([m.last_load.to(device).float() for m in moes])
    if reduce_loads is not None:
        reduce_loads(loads_NE)
    ratio_N = loads_NE.max(-1).values / loads_NE.mean(-1).clamp(min=1e-9)
    # The mean over layers in float64, as a mean of the layers' Python floats would be.
    mean_ratio = ratio_N.double().mean()
    for m in moes:
        if sync is not None:
            sync(m)
        m.update_bias()
    return {"moe/load_max_over_mean": mean_ratio, "moe/load_max_over_mean_worst": ratio_N.max()}


def mla_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from k3model.mla import GatedMLA
    return [(n, m) for n, m in model.named_modules() if isinstance(m, GatedMLA)]


def track_max_logits(model: nn.Module, on: bool = True) -> None:
    """Have every MLA layer record its per-head max attention logit in training forwards."""
    for _, m in mla_layers(model):
        m.track_max_logit = on


def attention_logits(model: nn.Module, qk_clip_tau: float | None = None) -> dict[str, torch.Tensor]:
    """Each MLA head's max attention logit of the last training forward (`attn/max_logit/<layer>/h<i>`)
    and the largest over all heads (`attn/max_logit`), as tensors; with `qk_clip_tau`, QK-Clip after
    the optimizer step (K2's MuonClip; `GatedMLA.qk_clip_`) and the number of heads it rescaled."""
    if qk_clip_tau is not None and not qk_clip_tau > 0:
        raise ValueError(f"qk_clip_tau must be > 0 (or None for no clip), got {qk_clip_tau}")
    recorded = [(n, m) for n, m in mla_layers(model) if m.track_max_logit and m.max_logit_H is not None]
    if not recorded:
        return {}
    metrics: dict[str, torch.Tensor] = {}
    for name, m in recorded:
        for h, value in enumerate(m.max_logit_H.unbind()):
            metrics[f"attn/max_logit/{name}/h{h}"] = value
    metrics["attn/max_logit"] = torch.stack([m.max_logit_H.max() for _, m in recorded]).max()
    if qk_clip_tau is not None:
        metrics["attn/qk_clipped_heads"] = torch.stack([m.qk_clip_(qk_clip_tau) for _, m in recorded]).sum()
    return metrics


class CapturedStep:
    """A whole training step — forward, backward, optimizer step, balancing — captured once in a CUDA
    graph and replayed: one launch a step instead of thousands, and no idle device while the host
    walks the modules (the small profile's 512 × 128 step was partly host-paced; docs/log/gpu.md).

    `step(batch)` must be capturable: the same shapes every call, no host read of a device value,
    and every state it carries between steps updated in place — the optimizer built with
    `capturable=True` (its step count then lives on the device; pass it as `optimizer` to have that
    checked), LatentMoE's statistics are cleared in place, and the learning rate stays what it was
    at capture unless the optimizer holds it as a tensor. The first `warmup` calls run eagerly on a
    side stream — they compile and tune what the step launches, and they are real steps on `batch`;
    the capture records the next step without running it. A call copies its batch into the captured
    input and replays; it returns the step's output (a tensor the next call overwrites)."""

    def __init__(self, step: Callable[[torch.Tensor], Any], batch: torch.Tensor, warmup: int = 2,
                 optimizer: torch.optim.Optimizer | None = None):
        if batch.device.type != "cuda":
            raise ValueError(f"CapturedStep needs a CUDA batch (a CUDA graph), got {batch.device}")
        if warmup < 1:
            raise ValueError(f"warmup must be ≥ 1 (the optimizer's state is created by a first step), got {warmup}")
        if optimizer is not None and not all(g.get("capturable") for g in optimizer.param_groups):
            raise ValueError("the optimizer must be built with capturable=True: its step count is read on "
                             "the host otherwise, which a CUDA graph cannot replay")
        self.batch = batch.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step(self.batch)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        # The warm-up's freed activations go back to the device: the graph keeps a pool of its own.
        torch.cuda.empty_cache()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = step(self.batch)

    def __call__(self, batch: torch.Tensor) -> Any:
        self.batch.copy_(batch)
        self.graph.replay()
        return self.out


# ----------------------------------------------------------------------------------------------
# Resume

@dataclass
class Resumed:
    """Where a run continues: the saved train state (None for a fresh run) and what the loop kept."""
    state: TrainState | None
    step: int = 0
    history: list[dict] = field(default_factory=list)
    tokens_seen: int = 0

    @property
    def from_step(self) -> int | None:
        return None if self.state is None else self.step


def resume(model: nn.Module, directory: str | Path, log: Callable[[int, dict], None]) -> Resumed:
    """Load the weights and train state a killed run left in `directory` (a loop that saved with
    `save_state(..., extra={"history": …, "tokens_seen": …})`), or report a fresh start."""
    from k3model.checkpoint import load_resume_state
    # A damaged checkpoint is moved aside with a warning and the loop starts fresh, rather than
    # failing every rerun until someone deletes it by hand.
    # So is one whose fields this loop cannot use (a hostile or foreign train_state.json).
    found = load_resume_state(directory, check=lambda weights, state: _check_resumable(model, weights, state))
    if found is None:
        return Resumed(None)
    weights, state = found
    model.load_state_dict(weights)
    log(state.step, {"event/resumed_from_step": state.step})
    return Resumed(state, state.step, state.extra["history"], state.extra["tokens_seen"])


def _check_resumable(model: nn.Module, weights: dict[str, torch.Tensor], state: TrainState) -> None:
    """ValueError naming the first field of a resume checkpoint that this model and loop cannot use."""
    own = model.state_dict()
    if set(weights) != set(own):
        raise ValueError(f"its weights name {sorted(set(weights) ^ set(own))[:3]}… unlike this model's")
    for name, t in own.items():
        if weights[name].shape != t.shape or weights[name].dtype != t.dtype:
            raise ValueError(f"its {name} is {list(weights[name].shape)} {weights[name].dtype}, this model's "
                             f"{list(t.shape)} {t.dtype}")
    history, tokens = state.extra.get("history"), state.extra.get("tokens_seen")
    if not isinstance(history, list) or not all(isinstance(row, dict) for row in history):
        raise ValueError(f"its extra['history'] is a {type(history).__name__}, not a list of metric rows")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise ValueError(f"its extra['tokens_seen'] is {str(tokens)[:40]!r}, not a count")
    opt = state.optimizer
    if not isinstance(opt.get("state"), dict) or not isinstance(opt.get("param_groups"), list):
        raise ValueError("its optimizer state lacks the 'state' dict and 'param_groups' list of a state_dict")
    rng = state.rng
    py, np_state, torch_state = rng.get("python"), rng.get("numpy"), rng.get("torch")
    if not (isinstance(py, list) and len(py) == 3 and isinstance(py[1], list) and len(py[1]) == 625
            and all(isinstance(x, int) and 0 <= x < 1 << 32 for x in py[1])):
        raise ValueError("its RNG state's 'python' entry is not random.getstate()'s (version, 625 words, gauss)")
    if not (isinstance(np_state, list) and len(np_state) == 5 and isinstance(np_state[1], torch.Tensor)
            and np_state[1].shape == (624,) and isinstance(np_state[2], int) and 0 <= np_state[2] <= 624):
        raise ValueError("its RNG state's 'numpy' entry is not np.random.get_state()'s (name, 624 keys, pos, …)")
    if not (isinstance(torch_state, torch.Tensor) and torch_state.dtype == torch.uint8
            and torch_state.shape == torch.get_rng_state().shape):
        raise ValueError("its RNG state's 'torch' entry is not torch.get_rng_state()'s uint8 tensor")


def resume_point(directory: str | Path) -> TrainState | None:
    """The train state saved in `directory` (hashes verified), or None when there is no checkpoint."""
    from k3model.checkpoint import load_train_state
    directory = Path(directory)
    if not (directory / "manifest.json").exists():
        return None
    return load_train_state(directory)


def load_weights(model: nn.Module, directory: str | Path) -> dict[str, Any]:
    """Load a checkpoint's weights into `model` (hashes verified); returns its manifest."""
    from k3model.checkpoint import load_checkpoint
    weights, manifest = load_checkpoint(directory)
    model.load_state_dict(weights)
    return manifest


def restore_train_state(state: TrainState, optimizer: torch.optim.Optimizer) -> None:
    """Put the optimizer and every RNG back where `save_state` found them."""
    from k3model.checkpoint import restore_rng_state
    optimizer.load_state_dict(state.optimizer)
    restore_rng_state(state.rng)


def save_state(directory: str | Path, model: nn.Module, manifest_extra: dict[str, Any],
               optimizer: torch.optim.Optimizer | None = None, step: int = 0,
               extra: dict[str, Any] | None = None) -> None:
    """Write the weights (and, with an optimizer, the train state to resume from) atomically."""
    from k3model.checkpoint import TrainState, capture_rng_state, save_checkpoint
    state = None
    if optimizer is not None:
        state = TrainState(step=step, optimizer=optimizer.state_dict(), rng=capture_rng_state(),
                           extra=extra or {})
    save_checkpoint(directory, {k: v.detach().cpu() for k, v in model.state_dict().items()}, manifest_extra,
                    train_state=state, overwrite=True)


# ----------------------------------------------------------------------------------------------
# Metrics

def log_and_checkpoint(done: int, total: int, log_every: int, ckpt_every: int, buffer: MetricBuffer,
                       history: list[dict], log: Callable[[int, dict], None],
                       checkpoint: Callable[[int], None],
                       check: Callable[[list[dict]], None] | None = None) -> None:
    """The end of a loop's step `done` (1-based) of `total`: at log and checkpoint steps the buffered
    metrics are read into `history`; every `log_every` steps and at the last the newest row is
    logged; every `ckpt_every` steps before the last `checkpoint(done)` writes the resume point.
    `check(rows)` sees each flushed window before anything is logged or saved (and may raise)."""
    log_now = done % log_every == 0 or done == total
    ckpt_now = done % ckpt_every == 0 and done < total
    if log_now or ckpt_now:
        rows = buffer.flush()
        if check is not None:
            check(rows)
        history.extend(rows)
    if log_now:
        log(done, history[-1])
    if ckpt_now:
        checkpoint(done)
        buffer.restart_clock()


def tail_mean(history: list[dict], key: str, frac: float = 0.1) -> float:
    """Mean of `key` over the last `frac` of the history (at least one step): a less noisy endpoint."""
    n = max(math.ceil(len(history) * frac), 1)
    values = [h[key] for h in history[-n:] if key in h]
    return sum(values) / len(values)


class MetricBuffer:
    """Per-step metrics kept as given (0-d tensors or numbers) until `flush` reads them all at once.

        buf.append({"train/loss": loss.detach(), "step": 3}, tokens=4096)
        rows = buf.flush()   # one device→host copy: [{"train/loss": 2.31, "step": 3, "perf/tokens_per_s": …}]

    Tensors are read as float64 (exact for fp32 and bf16 values), so a flushed value equals
    `float(t)` bit for bit. Throughput is timed per window (from the previous flush or
    `restart_clock` to this flush, whose read waits for the device): a step's own host time would
    only measure kernel launches on a GPU. `tokens` and `seconds` total the flushed windows.
    """

    def __init__(self) -> None:
        self._pending: list[dict[str, Any]] = []
        self._window_tokens = 0
        self._t0 = time.perf_counter()
        self.tokens = 0
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self._pending)

    def append(self, metrics: dict[str, Any], tokens: int = 0) -> None:
        self._pending.append(metrics)
        self._window_tokens += tokens

    def restart_clock(self) -> None:
        """Start the next window now: call after untimed work (a checkpoint write, an evaluation)."""
        self._t0 = time.perf_counter()

    def flush(self) -> list[dict[str, Any]]:
        """The pending rows with tensors read to floats, in order; the buffer is emptied."""
        rows, self._pending = self._pending, []
        slots = [(i, k) for i, row in enumerate(rows) for k, v in row.items() if isinstance(v, torch.Tensor)]
        by_device: dict[torch.device, list[int]] = {}
        for j, (i, k) in enumerate(slots):
            by_device.setdefault(rows[i][k].device, []).append(j)
        values = [0.0] * len(slots)
        for js in by_device.values():
            stacked = torch.stack([rows[slots[j][0]][slots[j][1]].detach().reshape(()).double() for j in js])
            for j, v in zip(js, stacked.cpu().tolist()):
                values[j] = v
        out = [dict(row) for row in rows]
        for (i, k), v in zip(slots, values):
            out[i][k] = v
        seconds = time.perf_counter() - self._t0
        if self._window_tokens:
            rate = self._window_tokens / max(seconds, 1e-9)
            for row in out:
                row["perf/tokens_per_s"] = rate
        self.tokens += self._window_tokens
        self.seconds += seconds
        self._window_tokens = 0
        self._t0 = time.perf_counter()
        return out

    @staticmethod
    def read(metrics: dict[str, Any]) -> dict[str, Any]:
        """One step's metrics with tensors read to floats (one device→host copy)."""
        buffer = MetricBuffer()
        buffer.append(metrics)
        return buffer.flush()[0]
