#!/usr/bin/env bash
# The H200 calls of one device session, each a whole check-and-benchmark inside the 10-minute limit
# of one `run` (docs/gpu_runbook.md). Usage on the device machine, from the repository root:
#     bash benchmarks/h200_calls.sh kernels   # KDA GPU tests, training step (small), KDA variant sweep
#     bash benchmarks/h200_calls.sh fla [SHAPES]  # KDA vs fla-core 0.6.0 vs SDPA + decode (carry .whl);
#                                                # SHAPES: kda.py --shapes, e.g. 0,1,2 then 3 (the four
#                                                # shapes took 480-580 s, too near one call's 600 s)
#     bash benchmarks/h200_calls.sh mx        # MXFP4 GEMV variants vs bf16
#     bash benchmarks/h200_calls.sh step      # the small profile's training step, then its profile
# Results land in $OUT as JSON (and logs); the kda_variants JSON of an earlier call in the same warm
# machine is kept in /tmp so later calls run the fastest correct variant ("best:").
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:?run on the device machine, where OUT is set}
SWEEP=/tmp/kda_variants_h200.json
T0=$SECONDS
elapsed() { echo "[$((SECONDS - T0)) s] $*"; }
best_tiles() { if [ -s "$SWEEP" ]; then echo "best:$SWEEP"; else echo default; fi; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

case "${1:?which call: kernels, fla or mx}" in
kernels)
    timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/kda/test_chunk_triton_gpu.py \
        >"$OUT/kda_gpu_tests.log" 2>&1
    status=$?; elapsed "GPU tests exit $status"; tail -n 15 "$OUT/kda_gpu_tests.log"
    # If the default failed its GPU tests, time the step with the kernels that passed on 2026-11-29.
    tiles=default; [ $status -eq 0 ] || tiles=fused_doubling
    timeout 240 python3 benchmarks/train_step.py --kda-tiles $tiles --out "$OUT/train_step_small_h200.json"
    elapsed "train_step exit $?"
    left=$((585 - (SECONDS - T0)))
    timeout $left python3 benchmarks/kda_variants.py --jobs 8 --budget $((left - 10)) \
        --out "$OUT/kda_variants_h200.json"
    elapsed "variants exit $?"; cp "$OUT/kda_variants_h200.json" "$SWEEP" 2>/dev/null
    ;;
fla)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PYTHONPATH
    timeout 580 python3 benchmarks/kda.py --tiles "$(best_tiles)" --shapes "${2:-all}" --out "$OUT/kda_h200.json"
    elapsed "kda.py exit $?"
    ;;
mx)
    timeout 580 python3 benchmarks/mx_variants.py --budget 540 --out "$OUT/mx_variants_h200.json"
    elapsed "mx_variants exit $?"
    ;;
step)
    timeout 150 python3 benchmarks/train_step.py --reps 3 --out "$OUT/train_step_small_h200.json"
    elapsed "train_step exit $?"
    timeout $((580 - (SECONDS - T0))) python3 benchmarks/profile_step.py --profile small --seq-len 512 \
        --tokens 65536 --out "$OUT/profile_step_small_h200.json"
    elapsed "profile_step exit $?"
    ;;
*) echo "unknown call $1"; exit 2 ;;
esac
