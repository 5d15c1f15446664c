#!/usr/bin/env bash
# The H200 calls of one device session, each a whole check-and-benchmark inside the 10-minute limit
# of one `run` (docs/gpu_runbook.md). Usage on the device machine, from the repository root:
#     bash benchmarks/h200_calls.sh kernels   # GPU tests of kernels/ (KDA, MX), MX host time per eager call
#     bash benchmarks/h200_calls.sh fla [SHAPES] [strong]  # KDA timing vs fla-core 0.6.0 (carry .whl);
#                                                # SHAPES: kda.py --shapes, e.g. 0; "strong": the strong-decay
#                                                # gradient check first. fla compiles and autotunes per shape
#                                                # (> 150 s at shape 0): one shape per call
#     bash benchmarks/h200_calls.sh sweep     # KDA launch-shape sweep (benchmarks/kernels/kda_variants.py)
#     bash benchmarks/h200_calls.sh mx        # MXFP4 matmul and grouped GEMV vs bf16
#     bash benchmarks/h200_calls.sh step      # the small profile's training step eager and compiled, with
#                                                # its dense peer, and a profile of each
#     bash benchmarks/h200_calls.sh decode    # the small profile's decode step eager and compiled, profiled
#     bash benchmarks/h200_calls.sh engine    # the engine's GPU tests (captured decode = eager), the compiled-regions
#                                                # tests, speculative decoding on the small profile (random weights)
#     bash benchmarks/h200_calls.sh glue      # the Triton ShortConv and AttnRes kernels (GPU tests, timings against
#                                                # Inductor), the compiled-regions tests, then the 512 × 128 and
#                                                # 65,536 × 1 training steps with their dense peer (issue 22 item 3)
#     bash benchmarks/h200_calls.sh rows      # the MoE row ops' GPU tests, the 512 × 128 step with its dense peer, its profile
#     bash benchmarks/h200_calls.sh step-both # the compiled-regions GPU tests, both training-step rows and the dense peer
#     bash benchmarks/h200_calls.sh idle      # the 512 × 128 step's idle device time, regions as they are and as CUDA graphs
#     bash benchmarks/h200_calls.sh cudagraphs # both training-step rows with the regions under CUDA graph trees
#     bash benchmarks/h200_calls.sh glue-sweep # their launch shapes swept (benchmarks/probes/glue_sweep.py), then both
#                                                # training-step rows with the fastest
#     bash benchmarks/h200_calls.sh graph     # both training-step rows, each model's whole step one CUDA graph; its GPU
#                                                # test; the conv kernels' launch shapes by device time
#     bash benchmarks/h200_calls.sh graph-profile # both rows captured again, then the captured 512 × 128 step's profile
#     bash benchmarks/h200_calls.sh gpu-tests # the GPU tests of the glue kernels, compiled regions, captured step, engine
#     bash benchmarks/h200_calls.sh eager-profile # the 512 × 128 row and its profile without the capture
#     bash benchmarks/h200_calls.sh orch [STEPS1] [STEPS2] [compiled]  # `k3 run` through Dagster and Ray on the
#                                                # GPU, a short small-profile selection (carry site.tar.xz from
#                                                # benchmarks/pack_site.sh); "compiled": PretrainConfig.compile_regions
# Results land in $OUT as JSON (and logs); copy them to benchmarks/results/<area>/<date>_<label>.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:?run on the device machine, where OUT is set}
T0=$SECONDS
elapsed() { echo "[$((SECONDS - T0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

case "${1:?which call: kernels, fla, sweep, mx, step, decode, engine, glue, rows, step-both, idle, cudagraphs, glue-sweep, graph, graph-profile, gpu-tests, eager-profile or orch}" in
kernels)
    timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/kda/test_chunk_triton_gpu.py \
        >"$OUT/kda_gpu_tests.log" 2>&1
    elapsed "KDA GPU tests exit $?"; tail -n 15 "$OUT/kda_gpu_tests.log"
    timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/mx/test_gemv_gpu.py \
        >"$OUT/mx_gpu_tests.log" 2>&1
    elapsed "MX GPU tests exit $?"; tail -n 15 "$OUT/mx_gpu_tests.log"
    timeout 120 python3 benchmarks/kernels/mx_host.py --out "$OUT/mx_host_h200.json"
    elapsed "mx_host exit $?"
    ;;
fla)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PYTHONPATH
    # ${3:-}: "strong" adds the strong-decay gradient check first (fla compiles for it too: ~2 minutes)
    timeout $((580 - (SECONDS - T0))) python3 benchmarks/kernels/kda.py ${3:+--strong-decay} --no-decode \
        --shapes "${2:-all}" --out "$OUT/kda_vs_fla_h200.json"
    elapsed "kda.py exit $?"
    ;;
sweep)
    timeout 580 python3 benchmarks/kernels/kda_variants.py --jobs 8 --budget 560 --out "$OUT/kda_variants_h200.json"
    elapsed "variants exit $?"
    ;;
mx)
    timeout 400 python3 benchmarks/kernels/mx.py --out "$OUT/mx_h200.json"
    elapsed "mx.py exit $?"
    timeout $((580 - (SECONDS - T0))) python3 benchmarks/kernels/mx_grouped.py --out "$OUT/mx_grouped_h200.json"
    elapsed "mx_grouped exit $?"
    ;;
step)  # eager, then with compiled regions (k3model/compiled.py), each with its dense peer; profiles
    # at 512 × 128 of both (2026-12-01 with the fla timing before it: 360 s for all but the last profile)
    # The Inductor test compiles the smoke model twice (~150 s on a fresh machine).
    timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/k3model/test_compiled.py >"$OUT/compiled_tests.log" 2>&1
    elapsed "compiled-regions tests exit $?"; tail -n 5 "$OUT/compiled_tests.log"
    timeout 120 python3 benchmarks/model/train_step.py --reps 3 --out "$OUT/train_step_small_h200_eager.json"
    elapsed "train_step eager exit $?"
    timeout 300 python3 benchmarks/model/train_step.py --reps 3 --compile-regions \
        --out "$OUT/train_step_small_h200_regions.json"
    elapsed "train_step regions exit $?"
    timeout 60 python3 benchmarks/model/profile_step.py --profile small --seq-len 512 --tokens 65536 \
        --out "$OUT/profile_step_small_h200_eager.json"
    elapsed "profile_step eager exit $?"
    timeout $((590 - (SECONDS - T0))) python3 benchmarks/model/profile_step.py --profile small --seq-len 512 \
        --tokens 65536 --compile-regions --out "$OUT/profile_step_small_h200_regions.json"
    elapsed "profile_step regions exit $?"
    ;;
decode)  # the small profile's decode step (issue 16 item 5), eager modules then compiled regions
    skip=routing_flips,diagnose,logprob_mismatch,mx_experts
    timeout 240 python3 benchmarks/decode/decode.py --device cuda --profile small --batches 1,16,64 --prompt 512 \
        --new 128 --skip $skip --out "$OUT/decode_small_h200_eager.json"
    elapsed "decode eager exit $?"
    timeout $((590 - (SECONDS - T0))) python3 benchmarks/decode/decode.py --device cuda --profile small \
        --batches 1,16,64 --prompt 512 --new 128 --skip $skip --compile-regions \
        --out "$OUT/decode_small_h200_regions.json"
    elapsed "decode regions exit $?"
    ;;
engine)  # the engine's CUDA path (issue 16), then speculative decoding on small (issue 20 item 5)
    timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/k3model/test_engine_gpu.py >"$OUT/engine_gpu_tests.log" 2>&1
    elapsed "engine GPU tests exit $?"; tail -n 15 "$OUT/engine_gpu_tests.log"
    timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/k3model/test_compiled.py >"$OUT/compiled_tests.log" 2>&1
    elapsed "compiled-regions tests exit $?"; tail -n 15 "$OUT/compiled_tests.log"
    timeout $((590 - (SECONDS - T0))) python3 benchmarks/decode/speculative.py --profile small --device cuda --dtype bf16 \
        --prompts 2 --new 32 --reps 1 --draft-lens 1,4 --out "$OUT/speculative_small_h200.json"
    elapsed "speculative exit $?"
    ;;
glue)  # issue 22 item 3: the KDA layer's conv and the AttnRes mix as Triton kernels
    timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/short_conv/test_short_conv_triton_gpu.py \
        tests/kernels/attn_res/test_attn_res_triton_gpu.py >"$OUT/glue_gpu_tests.log" 2>&1
    elapsed "glue GPU tests exit $?"; tail -n 12 "$OUT/glue_gpu_tests.log"
    timeout 60 python3 benchmarks/kernels/short_conv.py --out "$OUT/short_conv_h200.json" >"$OUT/short_conv.log" 2>&1
    elapsed "short_conv bench exit $?"; tail -n 8 "$OUT/short_conv.log"
    timeout 60 python3 benchmarks/kernels/attn_res.py --out "$OUT/attn_res_h200.json" >"$OUT/attn_res.log" 2>&1
    elapsed "attn_res bench exit $?"; tail -n 8 "$OUT/attn_res.log"
    timeout 360 python3 benchmarks/model/train_step.py --profile small --lengths 512,65536 --micro-batches 2,1 \
        --checkpointing off,profile --compile-regions --reps 3 --out "$OUT/train_step_small_h200_glue.json" \
        >"$OUT/train_step.log" 2>&1
    elapsed "train_step exit $?"; grep '^{' "$OUT/train_step.log"
    timeout $((590 - (SECONDS - T0))) python3 -m pytest -q -x -p no:cacheprovider tests/k3model/test_compiled.py \
        >"$OUT/compiled_tests.log" 2>&1
    elapsed "compiled-regions tests exit $?"; tail -n 5 "$OUT/compiled_tests.log"
    ;;
rows)  # the MoE's atomic-free row ops (kernels/moe_rows) and the step without the bias update's host reads:
    # their GPU tests, the 512 × 128 row with its dense peer, then the profile of that step
    timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/moe_rows/test_moe_rows_triton_gpu.py \
        >"$OUT/moe_rows_gpu_tests.log" 2>&1
    elapsed "moe_rows GPU tests exit $?"; tail -n 12 "$OUT/moe_rows_gpu_tests.log"
    timeout 300 python3 benchmarks/model/train_step.py --profile small --lengths 512 --micro-batches 2 \
        --checkpointing off --compile-regions --reps 3 --out "$OUT/train_step_small_h200_512.json" \
        >"$OUT/train_step.log" 2>&1
    elapsed "train_step exit $?"; grep '^{' "$OUT/train_step.log"
    timeout $((590 - (SECONDS - T0))) python3 benchmarks/model/profile_step.py --profile small --seq-len 512 \
        --tokens 65536 --compile-regions --checkpointing off --micro-batches 2 --attribute --top 40 \
        --out "$OUT/profile_step.json" >"$OUT/profile_step.log" 2>&1
    elapsed "profile_step exit $?"; tail -n 45 "$OUT/profile_step.log"
    ;;
glue-sweep)  # the glue kernels' launch shapes swept by device time, then both training-step rows with the fastest
    timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/short_conv/test_short_conv_triton_gpu.py \
        tests/kernels/attn_res/test_attn_res_triton_gpu.py tests/kernels/moe_rows/test_moe_rows_triton_gpu.py \
        >"$OUT/glue_gpu_tests.log" 2>&1
    elapsed "glue GPU tests exit $?"; tail -n 3 "$OUT/glue_gpu_tests.log"
    timeout 200 python3 benchmarks/probes/glue_sweep.py --out "$OUT/glue_sweep_h200.json" >"$OUT/glue_sweep.log" 2>&1
    elapsed "glue sweep exit $?"; best=$(tail -n 1 "$OUT/glue_sweep.log"); echo "fastest: $best"
    case "$best" in kernels.*) ;; *) best="" ;; esac
    timeout $((585 - (SECONDS - T0))) python3 benchmarks/model/train_step.py --profile small --lengths 512,65536 \
        --micro-batches 2,1 --checkpointing off,profile --compile-regions --reps 3 --kernel-constants "$best" \
        --out "$OUT/train_step_small_h200_glue_sweep.json" >"$OUT/train_step.log" 2>&1
    elapsed "train_step exit $?"; grep '^{' "$OUT/train_step.log"
    ;;
step-both)  # the compiled-regions GPU tests, then both training-step rows with their dense peer, one run
    timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/k3model/test_compiled.py >"$OUT/compiled_tests.log" 2>&1
    elapsed "compiled-regions tests exit $?"; tail -n 5 "$OUT/compiled_tests.log"
    timeout $((585 - (SECONDS - T0))) python3 benchmarks/model/train_step.py --profile small --lengths 512,65536 \
        --micro-batches 2,1 --checkpointing off,profile --compile-regions --reps 3 \
        --out "$OUT/train_step_small_h200_both.json" >"$OUT/train_step.log" 2>&1
    elapsed "train_step exit $?"; grep '^{' "$OUT/train_step.log"
    ;;
idle)  # where the 512 × 128 step's device sits idle (profile_step's device_idle), with the compiled regions as
    # they are and then under CUDA graph trees (compile mode reduce-overhead); never run yet
    for mode in default reduce-overhead; do
        end=$([ $mode = default ] && echo 290 || echo 585)
        timeout $((end - (SECONDS - T0))) python3 benchmarks/model/profile_step.py \
            --profile small --seq-len 512 --tokens 65536 --compile-regions --checkpointing off --micro-batches 2 \
            --attribute --top 40 $([ $mode = default ] || echo --compile-mode $mode) \
            --out "$OUT/profile_step_$mode.json" >"$OUT/profile_step_$mode.log" 2>&1
        elapsed "profile_step $mode exit $?"; grep -A3 "device idle" "$OUT/profile_step_$mode.log"
    done
    ;;
cudagraphs)  # both training-step rows with the dense peer, the compiled regions under CUDA graph trees; never run yet
    timeout 585 python3 benchmarks/model/train_step.py --profile small --lengths 512,65536 --micro-batches 2,1 \
        --checkpointing off,profile --compile-regions --compile-mode reduce-overhead --reps 3 \
        --out "$OUT/train_step_small_h200_cudagraphs.json" >"$OUT/train_step.log" 2>&1
    elapsed "train_step exit $?"; grep '^{' "$OUT/train_step.log"; grep -i "skipping cudagraphs" "$OUT/train_step.log" | sort | uniq -c | head
    ;;
graph)  # issue 22 item 3: the whole training step captured in one CUDA graph (k3model.train.common.CapturedStep),
    # the dense peer's step captured alike: both rows, then the capture's GPU test, then the conv kernels' launch
    # shapes by device time (their int32 tile addressing, never timed before)
    timeout 420 python3 benchmarks/model/train_step.py --profile small --lengths 512,65536 --micro-batches 2,1 \
        --checkpointing off,profile --compile-regions --cuda-graph on --reps 5 \
        --out "$OUT/train_step_small_h200_cuda_graph.json" >"$OUT/train_step.log" 2>&1
    elapsed "train_step exit $?"; grep '^{' "$OUT/train_step.log"
    timeout $((540 - (SECONDS - T0))) python3 -m pytest -q -x -s -p no:cacheprovider \
        tests/k3model/test_captured_step_gpu.py >"$OUT/captured_step_gpu_tests.log" 2>&1
    elapsed "captured-step GPU tests exit $?"; grep -E "compiled=|passed|failed|Error" "$OUT/captured_step_gpu_tests.log" | head
    timeout $((590 - (SECONDS - T0))) python3 benchmarks/probes/glue_sweep.py --only short_conv \
        --out "$OUT/glue_sweep_short_conv_h200.json" >"$OUT/glue_sweep.log" 2>&1
    elapsed "conv sweep exit $?"; grep -E '"BWD_ROWS": (32|64), "BWD_WARPS": 4|"FWD_ROWS": (32|64), "FWD_WARPS": 4' "$OUT/glue_sweep.log"
    ;;
graph-profile)  # the captured step again (both rows, both models captured), then the 512 × 128 step's profile
    # under the graph: device time by kernel kind, idle device between kernels
    timeout 330 python3 benchmarks/model/train_step.py --profile small --lengths 512,65536 --micro-batches 2,1 \
        --checkpointing off,profile --compile-regions --cuda-graph on --reps 5 \
        --out "$OUT/train_step_small_h200_cuda_graph.json" >"$OUT/train_step.log" 2>&1
    elapsed "train_step exit $?"; grep '^{' "$OUT/train_step.log"
    timeout $((590 - (SECONDS - T0))) python3 benchmarks/model/profile_step.py --profile small --seq-len 512 \
        --tokens 65536 --compile-regions --checkpointing off --micro-batches 2 --cuda-graph --attribute --top 40 \
        --out "$OUT/profile_step_cuda_graph.json" >"$OUT/profile_step.log" 2>&1
    elapsed "profile_step exit $?"; tail -n 45 "$OUT/profile_step.log"
    ;;
gpu-tests)  # the GPU tests of what session 21 touched: the glue kernels (the conv's int32 tile addressing), the
    # compiled regions and LatentMoE's in-place statistics, the captured step, the engine
    timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/short_conv/test_short_conv_triton_gpu.py \
        tests/kernels/attn_res/test_attn_res_triton_gpu.py tests/kernels/moe_rows/test_moe_rows_triton_gpu.py \
        >"$OUT/glue_gpu_tests.log" 2>&1
    elapsed "glue GPU tests exit $?"; tail -n 3 "$OUT/glue_gpu_tests.log"
    timeout 250 python3 -m pytest -q -x -p no:cacheprovider tests/k3model/test_compiled.py >"$OUT/compiled_tests.log" 2>&1
    elapsed "compiled-regions tests exit $?"; tail -n 3 "$OUT/compiled_tests.log"
    timeout $((590 - (SECONDS - T0))) python3 -m pytest -q -x -s -p no:cacheprovider tests/k3model/test_captured_step_gpu.py \
        tests/k3model/test_engine_gpu.py >"$OUT/captured_engine_tests.log" 2>&1
    elapsed "captured-step and engine GPU tests exit $?"; grep -E "compiled=|passed|failed|Error" "$OUT/captured_engine_tests.log" | head
    ;;
eager-profile)  # the same machine's "before": the 512 × 128 row without the capture, then that step's profile
    timeout 250 python3 benchmarks/model/train_step.py --profile small --lengths 512 --micro-batches 2 --checkpointing off \
        --compile-regions --cuda-graph off --reps 5 --out "$OUT/train_step_small_h200_512_eager.json" >"$OUT/train_step.log" 2>&1
    elapsed "train_step exit $?"; grep '^{' "$OUT/train_step.log"
    timeout $((440 - (SECONDS - T0))) python3 benchmarks/model/profile_step.py --profile small --seq-len 512 \
        --tokens 65536 --compile-regions --checkpointing off --micro-batches 2 --attribute --top 40 \
        --out "$OUT/profile_step_eager.json" >"$OUT/profile_step.log" 2>&1
    elapsed "profile_step exit $?"; grep -E "^step|device idle|launches|host syncs" "$OUT/profile_step.log"
    ;;
orch)  # 2026-12-01: unpack 3 s, k3 run 193 s (data 14 s, stage 1 109 s, stage 2 63 s)
    mkdir -p /tmp/site && tar xJf site.tar.xz -C /tmp/site || exit 3
    export PYTHONPATH=$PYTHONPATH:/tmp/site K3_HOME=/tmp/k3orch_$SECONDS
    steps1=${2:-20} steps2=${3:-6}
    compiled=()  # a 4th argument "compiled": both stages with PretrainConfig.compile_regions
    [ "${4:-}" = compiled ] && compiled=(--set pretrain_stage_1.compile_regions=true --set pretrain_stage_2.compile_regions=true)
    timeout $((580 - (SECONDS - T0))) python3 -m pipelines.cli run --profile small --select '*pretrain_stage_2' ${compiled[@]+"${compiled[@]}"} \
        --set pretrain_stage_1.steps=$steps1 --set pretrain_stage_1.ckpt_every=$steps1 \
        --set pretrain_stage_1.eval_max_length=4096 --set pretrain_stage_1.eval_examples_per_cell=2 \
        --set pretrain_stage_2.steps=$steps2 --set pretrain_stage_2.ckpt_every=$steps2 \
        --set pretrain_stage_2.eval_max_length=4096 --set pretrain_stage_2.eval_examples_per_cell=2 \
        2>&1 | grep -v "BetaWarning\|return fn(" | tee "$OUT/k3run_small_h200.log"
    elapsed "k3 run exit ${PIPESTATUS[0]}"
    cp "$K3_HOME/mlflow/mlflow.db" "$OUT/mlflow_small_h200.db"
    ;;
*) echo "unknown call $1"; exit 2 ;;
esac
