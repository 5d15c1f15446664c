"""Training-step throughput of a profile's K3 model beside a dense SDPA transformer of the same active
size, measured in one process (issue 4 §7; DESIGN.md §5 asks for speed as a ratio measured in the
same run).

    python benchmarks/model/train_step.py --profile small --lengths 512,65536 --out results.json

Reports tokens/s and model-FLOPs utilization (MFU) for a forward+backward+AdamW step at each length.
The issue-22 figures on the H200 (docs/log/gpu.md) are of

    python benchmarks/model/train_step.py --profile small --lengths 512,65536 --micro-batches 2,1 \
        --checkpointing off,profile --compile-regions --cuda-graph on --reps 5

where `--cuda-graph on` captures each model's whole step (the dense peer's too) in one CUDA graph.
Model FLOPs per token = 6 · (active non-embedding parameters) + the sequence mixers' own work:
causal attention 3 · 2 · (T/2) · H · (d_qk + d_v) per MLA layer (half the T² matrix), and KDA's chunked
matmuls (Kimi Linear report Eq. 13, ×3 for forward + backward). The MFU denominator is a bf16
matmul ceiling measured in the same run. Random tokens: this measures speed, not learning.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from dataclasses import replace

import torch

from benchmarks.common import dense_baseline_for, dense_cpu_step, k3_train_step, run_header, time_interleaved
from k3model.config import get_profile
from k3model.model import K3Model
from k3model.params import count_params

KDA_CHUNK = 64


def model_flops_per_token(profile: str, seq_len: int) -> float:
    counts = count_params(profile)
    cfg = get_profile(profile).model
    dense = 6.0 * (counts["active"] - counts["parts"]["embedding"] - counts["parts"].get("vision", 0))
    qk = cfg.mla_qk_nope_dim + cfg.mla_qk_rope_dim
    # Causal attention: QKᵀ and AV over half the T×T matrix on average, ×3 for fwd + bwd.
    mla = cfg.n_mla_layers * 3 * 2 * (seq_len / 2) * cfg.mla_heads * (qk + cfg.mla_v_head_dim)
    d, C = cfg.kda_head_dim, KDA_CHUNK
    kda = cfg.n_kda_layers * 3 * cfg.kda_heads * (6 * d * d + 3 * C * d + C * C)
    return dense + mla + kda


def matmul_ceiling_tflops(device: str) -> float:
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    reps = 20
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def compile_glue() -> None:
    """torch.compile the K3 model's elementwise glue in place — RMSNorm, AttnRes's depth mixing and
    SiTU-GLU — to measure how much of the step is unfused elementwise work (an experiment: the
    model itself stays eager). The dense baseline uses none of these."""
    import k3model.attn_res
    import k3model.common
    import k3model.moe
    from k3model.compiled import mark_eager_islands

    mark_eager_islands()
    # dynamic=True: RMSNorm alone sees widths 1024 / 512 / 128 at several lengths, and static shapes
    # hit Dynamo's recompile limit (8) on the H200 run of 2026-11-29 (docs/log/pretrain.md).
    k3model.common.RMSNorm.forward = torch.compile(k3model.common.RMSNorm.forward, dynamic=True)
    k3model.attn_res.AttnRes.forward = torch.compile(k3model.attn_res.AttnRes.forward, dynamic=True)
    k3model.moe.situ_glu = torch.compile(k3model.moe.situ_glu, dynamic=True)


def time_steps(step_fn, warmup: int, reps: int, device: str) -> float:
    for _ in range(warmup):
        step_fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        step_fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def captured_or_eager(row: dict, who: str, step, ids, opt, cuda_graph: bool):
    """`step` as `f()` on `ids`: replays of one CUDA graph of it (train.common.CapturedStep) when
    `cuda_graph`, else the eager call. A capture that fails is written to the row
    (`{who}_cuda_graph_error`) and the row goes on eagerly; `{who}_cuda_graph` says which ran."""
    row[f"{who}_cuda_graph"] = False
    if cuda_graph:
        from k3model.train.common import CapturedStep

        try:
            captured = CapturedStep(step, ids, optimizer=opt)
            row[f"{who}_cuda_graph"] = True
            return lambda: captured(ids)
        except Exception as e:  # noqa: BLE001 — reported in the row, the eager step still timed
            row[f"{who}_cuda_graph_error"] = repr(e)[:500]
            torch.cuda.synchronize()
    return lambda: step(ids)


def _time_k3(row: dict, model, opt, ids, dtype_ctx, profile: str, cfg, warmup: int, reps: int,
             device: str, micro_batches: int = 1, cuda_graph: bool = False) -> None:
    """The K3 model's steps alone, into `row` (on CUDA; the caller frees the model before the dense one)."""
    B, T = ids.shape
    try:
        t0 = time.perf_counter()
        # The first step compiles (compiled regions); a captured one warms up and records the graph.
        step = captured_or_eager(row, "k3", lambda b: k3_train_step(model, opt, b, dtype_ctx, micro_batches),
                                 ids, opt, cuda_graph)
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        row["k3_first_step_s"] = time.perf_counter() - t0
        dt = time_steps(step, warmup, reps, device)
        row["k3_tokens_per_s"] = B * T / dt
        row["k3_step_s"] = dt
        row["k3_flops_per_token"] = model_flops_per_token(profile, T)
        row["k3_activation_checkpointing"] = cfg.activation_checkpointing
        if device == "cuda":
            row["k3_peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    except torch.OutOfMemoryError as e:
        row["k3_error"] = f"out of memory: {e}"[:300]
    except Exception as e:  # e.g. an op the GPU's torch lacks: keep the dense row and the JSON
        row["k3_error"] = repr(e)[:500]


def _time_dense(row: dict, ids, dtype_ctx, profile: str, cfg, warmup: int, reps: int, device: str,
                cuda_graph: bool = False) -> None:
    """The dense baseline's steps alone, into `row` (captured in a CUDA graph as the K3 step was)."""
    B, T = ids.shape
    dense, info = dense_baseline_for(profile)
    dense = dense.to(device)
    dopt = torch.optim.AdamW(dense.parameters(), lr=1e-4, fused=device == "cuda", capturable=cuda_graph)

    def dense_step(batch):
        with dtype_ctx():
            loss = dense.loss(batch)
        dopt.zero_grad(set_to_none=True)
        loss.backward()
        dopt.step()

    try:
        dt = time_steps(captured_or_eager(row, "dense", dense_step, ids, dopt, cuda_graph), warmup, reps, device)
        row["dense_tokens_per_s"] = B * T / dt
        n_nonembed = info["params"] - 2 * cfg.vocab_size * cfg.d_model
        attn = info["layers"] * 3 * 2 * (T / 2) * 2 * cfg.d_model
        row["dense_flops_per_token"] = 6 * n_nonembed + attn
        row["dense_info"] = info
    except torch.OutOfMemoryError as e:
        row["dense_error"] = f"out of memory: {e}"[:300]
    del dense, dopt
    if device == "cuda":
        torch.cuda.empty_cache()


def bench(profile: str, lengths: list[int], tokens_per_step: int, warmup: int, reps: int,
          out: str | None = None, compiled_glue: bool = False, moe: str = "auto",
          compiled_regions: bool = False, dense: bool = True, checkpointing=None,
          micro_batches=1, kernel_constants=None, compile_mode: str | None = None, cuda_graph=False) -> dict:
    """Times both models at every length; with `out`, rewrites the JSON after each length so a run
    cut short (a device time limit) keeps the rows it finished. `checkpointing` (None: the profile's
    setting), `micro_batches` and `cuda_graph` (both models' whole step captured in one CUDA graph,
    on CUDA) are one value for every length or a list, one per length."""
    per_length = lambda v: list(v) if isinstance(v, (list, tuple)) else [v] * len(lengths)  # noqa: E731
    checkpointings, micro_batch_counts = per_length(checkpointing), per_length(micro_batches)
    cuda_graphs = per_length(cuda_graph)
    if not len(checkpointings) == len(micro_batch_counts) == len(cuda_graphs) == len(lengths):
        raise ValueError(f"checkpointing, micro_batches and cuda_graph take one value or one per length "
                         f"({len(lengths)})")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype_ctx = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device == "cuda" else \
        (lambda: torch.autocast("cpu", enabled=False))
    profile_cfg = replace(get_profile(profile).model, vision=None, mtp_depth=0)
    results = {"header": run_header(), "profile": profile, "device": device, "rows": [], "compiled_glue": compiled_glue,
               "compiled_regions": compiled_regions, "compile_mode": compile_mode, "inductor_tuning": _inductor_tuning(),
               "kernel_constants": kernel_constants or {},
               "moe_expert_matmuls": moe, "threads": torch.get_num_threads(),
               "load_avg_1min_start": os.getloadavg()[0]}
    if device == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
        results["bf16_matmul_tflops_ceiling"] = matmul_ceiling_tflops(device)
        from kernels.kda.triton.common import TileConfig
        results["kda_tile_config"] = dataclasses.asdict(TileConfig())  # the model runs the default tiles
    for T, checkpointing, micro_batches, cuda_graph in zip(lengths, checkpointings, micro_batch_counts, cuda_graphs):
        cuda_graph = cuda_graph and device == "cuda"
        cfg = profile_cfg if checkpointing is None else replace(profile_cfg, activation_checkpointing=checkpointing)
        B = max(tokens_per_step // T, 1)
        if micro_batches < 1 or B % micro_batches:
            raise ValueError(f"--micro-batches {micro_batches} must divide the {B} rows of a step at length {T} "
                             "(equal parts give the whole batch's gradient)")
        ids = torch.randint(0, cfg.vocab_size, (B, T), device=device)
        row = {"seq_len": T, "batch": B, "tokens_per_step": B * T, "micro_batches": micro_batches}
        torch.manual_seed(0)
        model = K3Model(cfg).to(device)
        for layer in model.moe_layers():
            layer.grouped_matmuls = {"auto": None, "loop": False, "grouped": True}[moe]
        if compiled_regions:
            from k3model.compiled import compile_regions

            compile_regions(model, dynamic=True, **({"mode": compile_mode} if compile_mode else {}))
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True, capturable=cuda_graph)

        if device == "cpu":
            # Both models live at once and take turns; rows report the median step.
            dense_step, info = dense_cpu_step(profile, ids)
            dts = time_interleaved({"k3": lambda: k3_train_step(model, opt, ids, dtype_ctx, micro_batches),
                                    "dense": dense_step},
                                   warmup, reps)
            row.update({"k3_tokens_per_s": B * T / dts["k3"], "k3_step_s": dts["k3"],
                        "k3_flops_per_token": model_flops_per_token(profile, T),
                        "dense_tokens_per_s": B * T / dts["dense"], "dense_step_s": dts["dense"],
                        "dense_info": info, "timing": f"median of {reps} interleaved steps",
                        "dense_flops_per_token": 6 * (info["params"] - 2 * cfg.vocab_size * cfg.d_model)
                        + info["layers"] * 3 * 2 * (T / 2) * 2 * cfg.d_model})
        else:
            _time_k3(row, model, opt, ids, dtype_ctx, profile, cfg, warmup, reps, device, micro_batches, cuda_graph)
        del model, opt
        if device == "cuda":
            torch.cuda.empty_cache()
            if dense:
                _time_dense(row, ids, dtype_ctx, profile, cfg, warmup, reps, device, cuda_graph)
        ceiling = results.get("bf16_matmul_tflops_ceiling")
        for who in ("k3", "dense"):
            if f"{who}_tokens_per_s" in row and ceiling:
                row[f"{who}_mfu"] = row[f"{who}_tokens_per_s"] * row[f"{who}_flops_per_token"] / (ceiling * 1e12)
        if "k3_tokens_per_s" in row and "dense_tokens_per_s" in row:
            row["k3_over_dense_tokens_per_s"] = row["k3_tokens_per_s"] / row["dense_tokens_per_s"]
        print(json.dumps(row), flush=True)
        results["rows"].append(row)
        if out:
            with open(out, "w") as f:
                json.dump(results, f, indent=2)
    return results


def set_kernel_constants(text: str) -> dict:
    """"kernels.attn_res.triton:ROW_TILE=1024,BWD_STAGES=2;kernels.short_conv.triton:BWD_ROWS=32"
    set on those modules (integers where they parse); returns what was set, by module."""
    import importlib

    done = {}
    for part in filter(None, text.split(";")):
        module_name, _, items = part.partition(":")
        module = importlib.import_module(module_name)
        for item in filter(None, items.split(",")):
            name, _, value = item.partition("=")
            if not hasattr(module, name):
                raise SystemExit(f"--kernel-constants: {module_name} has no constant {name!r}")
            setattr(module, name, int(value) if value.lstrip("-").isdigit() else value)
            done.setdefault(module_name, {})[name] = getattr(module, name)
    return done


def _inductor_tuning() -> bool:
    import torch._inductor.config

    return bool(torch._inductor.config.coordinate_descent_tuning)


_CHECKPOINTING = {"profile": None, "on": True, "off": False}.__getitem__
_ON_OFF = {"on": True, "off": False}.__getitem__


def _per_length_arg(text: str, lengths: list[int], parse) -> list:
    """"2" or "2,1": one value for every length, or one per length."""
    values = [parse(v) for v in text.split(",")]
    if len(values) not in (1, len(lengths)):
        raise SystemExit(f"{text!r}: give one value or one per length ({len(lengths)})")
    return values * len(lengths) if len(values) == 1 else values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None, help="default: small on a GPU, tiny on the CPU")
    parser.add_argument("--lengths", default=None, help="default: the profile's stage-1 and stage-4 lengths")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="default: the stage-4 length")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/train_step.json")
    parser.add_argument("--moe", choices=("auto", "loop", "grouped"), default="auto",
                        help="expert matmuls: grouped GEMM or a loop over experts (auto: grouped on CUDA)")
    parser.add_argument("--compile-regions", action="store_true",
                        help="k3model.compiled.compile_regions: the model's modules compiled regionally")
    parser.add_argument("--compile-mode", default=None,
                        help="torch.compile mode of the compiled regions, e.g. reduce-overhead (CUDA graphs)")
    parser.add_argument("--no-dense", action="store_true", help="time the K3 model only")
    parser.add_argument("--compile-glue", action="store_true",
                        help="torch.compile RMSNorm, AttnRes and SiTU-GLU first (see compile_glue)")
    parser.add_argument("--checkpointing", default="profile",
                        help="activation checkpointing of every layer: profile (its setting), on or off; "
                             "or one per length, comma-separated")
    parser.add_argument("--micro-batches", default="1",
                        help="the K3 step's batch in this many parts, one backward each (gradient "
                             "accumulation); or one count per length, comma-separated")
    parser.add_argument("--cuda-graph", default="off",
                        help="on: both models' whole training step captured in one CUDA graph and replayed "
                             "(k3model.train.common.CapturedStep); or one on/off per length, comma-separated")
    parser.add_argument("--inductor-tuning", action="store_true",
                        help="Inductor's coordinate-descent tuning of its kernels' launch shapes (longer compiles)")
    parser.add_argument("--kernel-constants", default="",
                        help="MODULE:NAME=VALUE,...;MODULE:... — launch-shape constants of kernels/*/triton.py "
                             "set before the model runs (the glue_sweep probe, tag probes-archive, printed its "
                             "fastest so)")
    args = parser.parse_args()
    kernel_constants = set_kernel_constants(args.kernel_constants)
    if args.inductor_tuning:
        import torch._inductor.config

        torch._inductor.config.coordinate_descent_tuning = True
    if args.compile_glue:
        compile_glue()
    profile = args.profile or ("small" if torch.cuda.is_available() else "tiny")
    stages = get_profile(profile).stages
    lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths
               else [stages[0].seq_len, stages[-1].seq_len])
    bench(profile, lengths, args.tokens_per_step or stages[-1].seq_len, args.warmup, args.reps, args.out,
          compiled_glue=args.compile_glue, moe=args.moe, compiled_regions=args.compile_regions,
          dense=not args.no_dense, checkpointing=_per_length_arg(args.checkpointing, lengths, _CHECKPOINTING),
          micro_batches=_per_length_arg(args.micro_batches, lengths, int), kernel_constants=kernel_constants,
          compile_mode=args.compile_mode, cuda_graph=_per_length_arg(args.cuda_graph, lengths, _ON_OFF))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
