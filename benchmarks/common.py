"""What the benchmarks share: the machine-and-versions header every result JSON starts with, GPU timing
by CUDA-graph replay, the ceilings measured in the same run, the MX problems, KDA tile configs, the
training steps (K3's and the dense peer's) that several scripts time, and a home's newest data files.

Benchmarks import this module and never each other (benchmarks/README.md: the groups and how to run
them). Results go to benchmarks/results/<area>/<date>_<label>.json (areas: kda, mx, decode, train,
envs, pipelines, posttrain, mopd).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import socket
import subprocess
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3model.config import get_profile
from k3model.params import count_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AREAS = ("kda", "mx", "decode", "train", "envs", "pipelines", "posttrain", "mopd")


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def run_header(commit: str | None = None) -> dict:
    """The machine and versions of this run: date, commit (git's, unless given: the device machine
    gets a copy of the tree without .git), host, CPU count and load, Python, torch, triton, CUDA,
    NCCL, fla if importable, and per GPU its name, SMs, memory, L2 and nvidia-smi's clocks and limits."""
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit or _git_commit(), "host": socket.gethostname(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(), "torch": torch.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
    }
    for name in ("triton", "fla"):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # optional: absent on some machines
            info[name] = None
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            info["nccl"] = None
        gpus = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"name": p.name, "sms": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1),
                         "l2_mib": getattr(p, "L2_cache_size", 0) / 2**20})
        info["gpus"] = gpus
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,"
                 "temperature.gpu", "--format=csv"], capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            info["nvidia_smi"] = f"nvidia-smi failed: {exc!r}"
    else:
        info["gpus"] = []
    return info


def write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def dated_result(area: str, name: str, obj) -> Path:
    """Write `obj` to benchmarks/results/<area>/<today>_<name>.json (floats for tensors and numpy
    scalars) and return the path: where a recipe's result goes."""
    path = Path(ROOT) / "benchmarks/results" / area / f"{datetime.date.today().isoformat()}_{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=float))
    return path


def close_report(report: dict, t_start: float, dump, error: str | None) -> int:
    """Record how a benchmark run ended (status "ok", or "failed" with the traceback's tail) and its
    seconds since t_start, write the report (dump()), and return the process exit code."""
    report["status"] = "ok" if error is None else "failed"
    if error is not None:
        report["error"] = error[-3000:]
        print(report["error"], flush=True)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    dump()
    return 0 if error is None else 1


# ---- GPU timing -------------------------------------------------------------------------------------

TIMING_NOTE = ("CUDA-graph replay, median of 10 replays, per call; one call per weight copy, with enough copies "
               "(weight_copies) that the weights stream from HBM rather than the 60 MB L2; hot_l2_* reuse one "
               "copy. Bytes: MXFP4 codes N*K/2 + scales N*K/32 (bf16: 2*N*K) + x + y. frac_copy_bw is over the "
               "device-to-device copy bandwidth measured in the same run.")


def time_calls(fns, reps: int = 10) -> float:
    """Median milliseconds per call: the calls (typically one per weight copy) are captured once in
    a CUDA graph and replayed, so there are no launch gaps; with one call per weight copy and
    enough copies, every call reads its weights from HBM, as one layer after another does."""
    if not torch.cuda.is_available():  # smoke runs: a host clock is enough to exercise the script
        t0 = time.perf_counter()
        for fn in fns:
            fn()
        return (time.perf_counter() - t0) * 1e3 / len(fns)
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(fns))
    del graph
    return sorted(times)[len(times) // 2]


def graph_us(fn, calls: int = 10, replays: int = 20) -> float:
    """Device µs per call of fn (CUDA): `calls` calls captured in one CUDA graph, replayed `replays`
    times between two events — the device's time alone, whatever the host's pace."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / (calls * replays)


def measure_ceilings(dev, smoke: bool = False) -> dict:
    """A device-to-device copy (bytes read + written) and a large bf16 GEMM, in this run."""
    a = torch.empty(2**29 if not smoke else 2**20, device=dev, dtype=torch.bfloat16).normal_()
    b = torch.empty_like(a)
    # Warm the clocks first: a 30 ms measurement straight after the host-side checks read
    # 2.77 TB/s on 2026-11-29 while bf16 cuBLAS then streamed 3.2 TB/s.
    for _ in range(3):
        time_calls([lambda: b.copy_(a)] * 20, reps=5)
    ms = time_calls([lambda: b.copy_(a)] * 8, reps=20)
    out = {"copy_GBps": round(2 * a.numel() * 2 / ms / 1e6, 1), "copy_bytes": 2 * a.numel() * 2}
    sz = 8192 if not smoke else 256
    p = torch.randn(sz, sz, device=dev, dtype=torch.bfloat16)
    q = torch.randn(sz, sz, device=dev, dtype=torch.bfloat16)
    ms = time_calls([lambda: torch.matmul(p, q)] * 4)
    out["bf16_matmul_TFLOPs"] = round(2 * sz**3 / ms / 1e9, 1)
    return out


# ---- MX problems ------------------------------------------------------------------------------------

MX_SHAPES = {"dense_7168": (7168, 7168), "expert_gate_up": (3584, 3072), "expert_down": (3072, 3584)}  # (K, N)


def mx_problem(m: int, k: int, n: int, dev, seed: int):
    """x [m, k] bf16 and an MXFP4 weight [n, k] (randn / sqrt(k), quantized)."""
    from kernels.mx import quantize_mx

    g = torch.Generator(device=dev).manual_seed(seed)
    w = torch.randn(n, k, device=dev, generator=g) / k**0.5
    x = torch.randn(m, k, device=dev, generator=g, dtype=torch.float32).to(torch.bfloat16)
    return x, quantize_mx(w, "fp4_e2m1")


def weight_copies(nbytes: int, l2_bytes: int) -> int:
    """Enough weight copies that a pass over all of them streams 2.5x the L2 (the weights come from HBM)."""
    return int(min(64, max(2, -(-int(2.5 * l2_bytes) // nbytes))))


# ---- KDA tile configs -------------------------------------------------------------------------------


def tile_config_from_arg(text: str):
    """A benchmark's --tiles value as a KDA TileConfig: 'default', 'best:SWEEP.json' (the fastest correct
    variant of a benchmarks/kernels/kda_variants.py run, from the tile_config it recorded), or overrides
    'bwd_pairs_warps=4,state_warps=4'."""
    from kernels.kda.triton.common import TileConfig

    if text in ("", "default"):
        return TileConfig()
    if text.startswith("best:"):
        with open(text[5:]) as f:
            variants = json.load(f)["variants"]
        timed = {n: r for n, r in variants.items()
                 if r.get("correct") is True and "fwdbwd" in r.get("ms", {}) and "tile_config" in r}
        if not timed:
            raise ValueError(f"{text[5:]}: no variant is both correct and timed")
        best = min(timed.values(), key=lambda r: r["ms"]["fwdbwd"])
        return TileConfig(**best["tile_config"])
    pairs = [kv.split("=") for kv in text.split(",")]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"--tiles {text!r}: expected 'default', 'best:SWEEP.json' or 'name=value,...'")
    return dataclasses.replace(TileConfig(), **{k: int(v) for k, v in pairs})


# Kernel-name patterns, first match wins: where the device time of a step goes.
KERNEL_KINDS = (
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "sm90_", "grouped_mm", "cublas")),
    ("attention (sdpa)", ("flash", "fmha", "attention", "cudnn")),
    ("kda triton", ("_prep_", "_solve", "_state_", "_bwd_", "_chunk_", "_fwd_", "_decode_kernel", "kda")),
    ("inductor fused", ("triton_",)),
    ("copies", ("memcpy", "memset", "copy_kernel", "catarraybatchedcopy", "direct_copy")),
    ("reductions / sort / index", ("reduce_kernel", "sort", "radix", "index", "scatter", "gather",
                                   "topk", "cumsum", "scan")),
    ("elementwise (aten)", ("elementwise", "vectorized", "unrolled")),
)


def kernel_breakdown(events) -> dict:
    """Device time and launches per kind of kernel (KERNEL_KINDS), host synchronisations
    (device-to-host copies and stream/device synchronize calls) and the launch calls' host time."""
    kinds: dict[str, dict] = {}
    syncs = {"calls": 0, "host_ms": 0.0}
    launch_host_ms = 0.0
    for e in events:
        name = e.key.lower()
        if e.device_type.name == "CUDA" and not e.key.startswith("k3::"):  # not profile_step's ranges
            kind = next((k for k, pats in KERNEL_KINDS if any(p in name for p in pats)), "other")
            row = kinds.setdefault(kind, {"ms": 0.0, "launches": 0})
            row["ms"] += e.self_device_time_total / 1e3
            row["launches"] += e.count
        elif name in ("cudastreamsynchronize", "cudadevicesynchronize", "cudaeventsynchronize") or \
                "dtoh" in name:
            syncs["calls"] += e.count
            syncs["host_ms"] += e.self_cpu_time_total / 1e3
        if "launchkernel" in name:
            launch_host_ms += e.self_cpu_time_total / 1e3
    return {"kernels_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["ms"])),
            "host_synchronisations": syncs, "launch_calls_host_ms": launch_host_ms}


# ---- training steps ---------------------------------------------------------------------------------
# The K3 step and its dense peer as model/train_step.py, model/train_step_ab.py, model/profile_step.py
# and kernels/cpu_kernels.py time them.

class DenseBlock(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(a)
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class DenseTransformer(nn.Module):
    """The baseline: pre-norm, SDPA causal attention, SwiGLU, sized to the K3 model's active count."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(DenseBlock(d, heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def loss(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def dense_baseline_for(profile: str) -> tuple[DenseTransformer, dict]:
    cfg = get_profile(profile).model
    counts = count_params(profile)
    d, hidden = cfg.d_model, 4 * cfg.d_model
    per_layer = 4 * d * d + 3 * d * hidden
    target = counts["active"] - counts["parts"]["embedding"] - counts["parts"]["lm_head"] - counts["parts"].get("vision", 0)
    layers = max(round(target / per_layer), 1)
    model = DenseTransformer(cfg.vocab_size, d, layers, max(d // 128, 1), hidden)
    n = sum(p.numel() for p in model.parameters())
    return model, {"layers": layers, "d_model": d, "ffn_hidden": hidden, "params": n}


def k3_train_step(model, opt: torch.optim.Optimizer, ids: torch.Tensor, autocast,
                  micro_batches: int = 1) -> None:
    """One K3 training step as the pretraining loop takes it: loss under `autocast()`, backward, the
    optimizer step, then each MoE layer's balancing-bias update. With `micro_batches` > 1 the batch's
    rows in that many equal parts, each part's mean loss / micro_batches backpropagated in turn (the
    same gradient as one backward of the whole batch's mean, up to rounding)."""
    # A new iteration for CUDA graph trees (compile mode "reduce-overhead"): the last step's graph
    # outputs may be overwritten. A counter bump otherwise.
    torch.compiler.cudagraph_mark_step_begin()
    opt.zero_grad(set_to_none=True)
    for part in ids.chunk(micro_batches):
        with autocast():
            loss = model.compute_loss(part)["loss/total"]
        (loss / micro_batches).backward()
    opt.step()
    for layer in model.moe_layers():
        layer.update_bias()


def dense_cpu_step(profile: str, ids: torch.Tensor):
    """(step, info): one fp32 training step of the profile's dense peer on `ids` (forward, backward,
    AdamW), as the CPU timings take it, and the peer's size."""
    dense, info = dense_baseline_for(profile)
    # Fused, as the trainers' build_optimizer builds it on the CPU: like for like with the K3 step.
    dopt = torch.optim.AdamW(dense.parameters(), lr=1e-4, fused=True)

    def dense_step():
        loss = dense.loss(ids)
        dopt.zero_grad(set_to_none=True)
        loss.backward()
        dopt.step()

    return dense_step, info


def time_interleaved(step_fns: dict, warmup: int, reps: int) -> dict[str, float]:
    """Median seconds per step of each function, run in turns (a, b, a, b, …): on a CPU shared with
    other work, load that comes and goes then falls on both models alike (issue 17)."""
    for _ in range(warmup):
        for fn in step_fns.values():
            fn()
    times = {name: [] for name in step_fns}
    for _ in range(reps):
        for name, fn in step_fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


# ---- a home's data ----------------------------------------------------------------------------------

DATA_FILES = {"tokenizer_path": ("tokenizer", "tokenizer.json"), "corpus_path": ("corpus", "corpus.parquet"),
              "images_path": ("image_data", "images.parquet"), "clue_eval_path": ("clue_data", "clue_eval.parquet")}


def newest_data(home, profile: str):
    """The pretraining data files (k3model PretrainData) of `profile`'s newest materializations under
    K3_HOME `home`, with the clue config the eval grid was built with."""
    # Imported here: the GPU machine has only torch, and the kernel and model benchmarks import this module.
    import pyarrow.parquet as pq

    from datagen.clues import CluesConfig
    from datagen.io import table_metadata
    from k3model.train.pretrain_data import PretrainData

    paths = {}
    for field, (asset, name) in DATA_FILES.items():
        found = sorted((Path(home) / "data" / profile / asset).glob(f"*/{name}"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise SystemExit(f"no {asset} for profile {profile} under {home}/data: materialize it first "
                             f"(K3_HOME={home} k3 run --profile {profile} --select {asset})")
        paths[field] = found[-1]
    # Training packs its clue examples with the config the eval grid was built with.
    recorded = table_metadata(pq.read_schema(paths["clue_eval_path"])).get("config", {})
    clues = CluesConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()})
    return PretrainData(clues=clues, **paths)
