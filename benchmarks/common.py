"""What the benchmarks share: the machine-and-versions header every result JSON starts with, GPU timing
by CUDA-graph replay, the ceilings measured in the same run, the MX problems, and KDA tile configs.

Benchmarks import this module and never each other. Results go to benchmarks/results/<area>/
<date>_<label>.json (areas: kda, mx, decode, train, envs, pipelines); one-question probes live in
benchmarks/probes/.
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

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AREAS = ("kda", "mx", "decode", "train", "envs", "pipelines")


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
    variant of a benchmarks/kda_variants.py run, from the tile_config it recorded), or overrides
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
