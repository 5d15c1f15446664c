#!/usr/bin/env bash
# The stable GPU-machine calls, each a whole check-and-benchmark inside the 10-minute limit of one
# `run` (docs/gpu_runbook.md: which to run next and how to send one). On the device machine, from the
# repository root:
#     bash benchmarks/h200_calls.sh kernels    # GPU tests of kernels/ (KDA, MX), MX host time per eager call
#     bash benchmarks/h200_calls.sh fla [SHAPES] [strong]  # KDA timing vs fla-core 0.6.0 (carry .whl);
#                                              # SHAPES: kda.py --shapes, e.g. 0; "strong": the strong-decay
#                                              # gradient check first. fla compiles and autotunes per shape
#                                              # (> 150 s at shape 0): one shape per call
#     bash benchmarks/h200_calls.sh sweep      # KDA launch-shape sweep (benchmarks/kernels/kda_variants.py)
#     bash benchmarks/h200_calls.sh mx         # MXFP4 matmul and grouped GEMV vs bf16
#     bash benchmarks/h200_calls.sh gpu-tests  # every GPU test: kernels, compiled regions, captured step, engine
#     bash benchmarks/h200_calls.sh step       # the small profile's training step (both rows, captured) with its
#                                              # dense peer, then the 512 x 128 step's profile
#     bash benchmarks/h200_calls.sh decode     # the small profile's decode step eager and compiled, profiled
#     bash benchmarks/h200_calls.sh fused      # fused input projections (k3model/fused.py): their tests, then
#                                              # GEMMs and the captured step fused vs unfused, small and tiny
#     bash benchmarks/h200_calls.sh engine     # the engine's GPU tests, the compiled-regions tests, speculative
#                                              # decoding on the small profile (random weights)
#     bash benchmarks/h200_calls.sh small SELECTION [--set …]   # small through Dagster + Ray, home kept in .k3/small
#     bash benchmarks/h200_calls.sh muon [STEPS] [SEEDS…]  # AdamW vs Per-Head Muon on small's stage 1 at equal
#                                              # tokens (benchmarks/recipes/muon_ab.py); K3_COMMIT=<commit> to record it
#     bash benchmarks/h200_calls.sh controls CELL…  # issue 40 item 4: the equal-token SFT controls of a powered home's
#                                              # cells (general_tasks_low …) trained on the GPU, one tar a cell back;
#                                              # `.gpu-ctl` carried: home/ (sft_policy, tokenizer, rl_tasks), cells/<cell>/
#                                              # (plan.json, grpo.json); scored on the CPU after (docs/gpu_runbook.md)
#     bash benchmarks/h200_calls.sh orch [STEPS1] [STEPS2] [compiled]  # `k3 run` through Dagster and Ray on the
#                                              # GPU, a short small-profile selection (carry site.tar.xz from
#                                              # benchmarks/pack_site.sh); "compiled": PretrainConfig.compile_regions
# Results land in $OUT as JSON (and logs); copy them to benchmarks/results/<area>/<date>_<label>.json and
# log the figures in docs/log/<area>.md. One-off calls of past sessions: docs/log/gpu.md (2026-12-05).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:?run on the device machine, where OUT is set}
T0=$SECONDS
elapsed() { echo "[$((SECONDS - T0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

case "${1:?which call: kernels, fla, sweep, mx, gpu-tests, step, decode, fused, engine, orch, small, muon or controls}" in
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
gpu-tests)  # every GPU test of the tree
    timeout 250 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/kda/test_chunk_triton_gpu.py \
        tests/kernels/mx/test_gemv_gpu.py tests/kernels/short_conv/test_short_conv_triton_gpu.py \
        tests/kernels/attn_res/test_attn_res_triton_gpu.py tests/kernels/moe_rows/test_moe_rows_triton_gpu.py \
        >"$OUT/kernels_gpu_tests.log" 2>&1
    elapsed "kernels GPU tests exit $?"; tail -n 3 "$OUT/kernels_gpu_tests.log"
    timeout 250 python3 -m pytest -q -x -p no:cacheprovider tests/k3model/test_compiled.py >"$OUT/compiled_tests.log" 2>&1
    elapsed "compiled-regions tests exit $?"; tail -n 3 "$OUT/compiled_tests.log"
    timeout $((590 - (SECONDS - T0))) python3 -m pytest -q -x -s -p no:cacheprovider tests/k3model/test_captured_step_gpu.py \
        tests/k3model/test_engine_gpu.py >"$OUT/captured_engine_tests.log" 2>&1
    elapsed "captured-step and engine GPU tests exit $?"; grep -E "compiled=|passed|failed|Error" "$OUT/captured_engine_tests.log" | head
    ;;
step)  # issue 22's rows: 512 x 128 and 65,536 x 1, compiled regions, each model's whole step one CUDA graph,
    # with the dense peer; then the captured 512 x 128 step's profile (device time by kernel kind, idle time)
    timeout 330 python3 benchmarks/model/train_step.py --profile small --lengths 512,65536 --micro-batches 2,1 \
        --checkpointing off,profile --compile-regions --cuda-graph on --reps 5 \
        --out "$OUT/train_step_small_h200_cuda_graph.json" >"$OUT/train_step.log" 2>&1
    elapsed "train_step exit $?"; grep '^{' "$OUT/train_step.log"
    timeout $((590 - (SECONDS - T0))) python3 benchmarks/model/profile_step.py --profile small --seq-len 512 \
        --tokens 65536 --compile-regions --checkpointing off --micro-batches 2 --cuda-graph --attribute --top 40 \
        --out "$OUT/profile_step_cuda_graph.json" >"$OUT/profile_step.log" 2>&1
    elapsed "profile_step exit $?"; tail -n 45 "$OUT/profile_step.log"
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
fused)  # issue 44 item 4: the small decode step's GEMMs fused by input (k3model/fused.py), batch 1 and 8
    timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/k3model/test_fused.py >"$OUT/fused_tests.log" 2>&1
    elapsed "fused tests exit $?"; tail -n 15 "$OUT/fused_tests.log"
    timeout $((590 - (SECONDS - T0))) python3 benchmarks/decode/fused.py --device cuda --profiles small,tiny \
        --batches 1,8 --prompt 512 --steps 64 --reps 5 --out "$OUT/fused_small_h200.json"
    elapsed "fused benchmark exit $?"
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
small)  # issue 42 item 5: small's lineage through Dagster + Ray on the GPU, reduced sizes via --set, a home under
    # the ignored .k3/ so a second call on the still-warm machine continues it: small SELECTION [k3 run args…]
    mkdir -p /tmp/site && tar xJf .gpu-orch/site.tar.xz -C /tmp/site || exit 3
    export PYTHONPATH=$PYTHONPATH:/tmp/site K3_HOME=$PWD/.k3/small RAY_AUTH_MODE=disabled
    sel=${2:?a --select}; shift 2
    timeout $((560 - (SECONDS - T0))) python3 -m pipelines.cli run --profile small --select "$sel" "$@" \
        2>&1 | grep -v "BetaWarning\|return fn(" | tee -a "$OUT/k3run_small.log"
    rc=${PIPESTATUS[0]}
    elapsed "k3 run exit $rc"
    if [ "$rc" != 0 ]; then  # the failed steps' whole tracebacks (the ✗ line has only the message)
        DAGSTER_HOME=$K3_HOME/dagster timeout 60 python3 -c '
from dagster import DagsterEventType, DagsterInstance
inst = DagsterInstance.get()
for e in inst.all_logs(inst.get_runs(limit=1)[0].run_id, of_type=DagsterEventType.STEP_FAILURE):
    err = e.dagster_event.event_specific_data.error
    while err is not None:
        print(e.step_key, err.to_string()); err = err.cause' >"$OUT/k3run_small_failures.txt" 2>&1
        tail -n 40 "$OUT/k3run_small_failures.txt"
    fi
    timeout 60 python3 -m pipelines.asset_devices --profile small --out "$OUT/small_assets.json" 2>&1 | grep -v Warn
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    ;;
muon)  # issue 43 item 2: AdamW vs Per-Head Muon on small's stage 1 (64 × 512 rows, lr 1e-3) at equal tokens, one
    # process: the interleaved step timing first (3 warm-up + 5 timed steps an optimizer), then a pair of
    # STEPS-step runs (default 40) per seed while --budget-s says the next pair ends by 540 s. Estimate (eager
    # loop): H200 ~1.5 s a step without checkpointing → two seeds; H100 ~2.6 s with it → one (docs/gpu_runbook.md)
    steps=${2:-40}; seeds=${*:3}; seeds=${seeds:-0 1 2}
    timeout $((590 - (SECONDS - T0))) python3 benchmarks/recipes/muon_ab.py --profile small --device cuda \
        --steps "$steps" --seeds $seeds --timing-first --timing-reps 5 --budget-s $((540 - (SECONDS - T0))) \
        ${K3_COMMIT:+--commit "$K3_COMMIT"} --out "$OUT/muon_ab_small_stage1_cuda.json" >"$OUT/muon_ab.log" 2>&1
    elapsed "muon_ab exit $?"; grep -E '^\{|^ |^built|^budget|Error' "$OUT/muon_ab.log" | cut -c1-1500 | tail -n 60
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    ;;
controls)  # every cell's control at once (a tiny SFT leaves the GPU mostly idle), 2 threads each; CTL_EXTRA: more
    # grpo_powered arguments (a dry run here: CTL_EXTRA="--control-budget 2000")
    shift
    recipe=$(python3 -c 'from benchmarks.recipes.powered import RECIPE; print(*RECIPE)') || exit 3
    for c in "$@"; do
        w=/tmp/ctl/$c; mkdir -p "$w" && cp .gpu-ctl/cells/"$c"/*.json "$w"/ || exit 3
        # shellcheck disable=SC2086  # the recipe's words
        OMP_NUM_THREADS=2 timeout $((590 - (SECONDS - T0))) python3 benchmarks/recipes/grpo_powered.py \
            --home .gpu-ctl/home --cell "${c%_*}/${c##*_}" $recipe ${CTL_EXTRA:-} --label "ctl_$c" --work "$w" \
            --phases control >"$w/control.log" 2>&1 &
    done
    wait
    for c in "$@"; do
        w=/tmp/ctl/$c
        elapsed "$c:"; tail -n 2 "$w/control.log"
        ck=$(python3 -c "import json; print(json.load(open('$w/control.json'))['checkpoint'])") || continue
        tar -C "$w" -cf "$OUT/${c}_control.tar" control.json control.log -C "$(dirname "$ck")" "$(basename "$ck")"
    done
    ;;
*) echo "unknown call $1"; exit 2 ;;
esac
