#!/usr/bin/env bash
# Session 6's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl):
#   bash bench/session6.sh 1   # issue 5 end to end, dense compiled: the bf16 and fp8 delayed presets with
#                              # turbo=megatron vs without (the turbo RMSNorm / attention / tp=1 linears no longer
#                              # break the compiled graph); then TorchTitan turbo fp8 linear vs torchao float8
#   bash bench/session6.sh 2   # every turbo kernel test on the GPU, then the kernels' GPU time: the fp8 linear and
#                              # each of its GEMMs alone (where blockwise loses), casts, SwiGLU, permute
#   bash bench/session6.sh 3   # turbo on vs off eager (bf16) and MoE
#   bash bench/session6.sh 4   # the session's kernel changes on the GPU (tests, GPU time), blockwise end to end
#   bash bench/session6.sh 5   # the rest of call 4's tests; autotune picks timed on the device vs every config
# $OUT: logs, bench_*.md/json, pytest_gpu.log, turbo_kernels.json
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
B="training.train_iters=14"
case "${1:-}" in
  1) OUT=$OUT LOGS=$LOGS bash bench/turbo_e2e.sh dense
     L=$((580 - SECONDS))
     [ $L -gt 120 ] && timeout $L python bench/e2e.py --suite none --tag tt_fp8 --timeout 90 --log-dir "$LOGS" \
       --ref "torchtitan fp8 torchao" --extra "torchtitan fp8 torchao=experiment=llama3_2_1b_torchtitan_fp8" \
       --extra "torchtitan fp8 turbo=experiment=llama3_2_1b_torchtitan_fp8 turbo=torchtitan_fp8" \
       > "$OUT/tt_fp8.log" 2>&1
     grep -E "^\| " "$OUT/tt_fp8.log" ;;
  2) timeout 300 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_*.py \
       > "$OUT/pytest_gpu.log" 2>&1
     tail -25 "$OUT/pytest_gpu.log"
     L=$((585 - SECONDS))
     timeout $L python bench/turbo_kernels.py --no-tests --gpu-time --budget $((L - 10)) \
       --only fp8_gemms,fp8_linear,fp8_casts,swiglu,permute > "$OUT/kernels.log" 2>&1
     grep -E "^\| |timing" "$OUT/kernels.log" ;;
  3) OUT=$OUT LOGS=$LOGS bash bench/turbo_e2e.sh eager
     OUT=$OUT LOGS=$LOGS bash bench/turbo_e2e.sh moe ;;
  4) # after this session's kernel changes: the blockwise casts (tuned: 16 / 32 warps, sliced two-pass), the
     # blockwise x^T cast moved into the forward, the tuned SwiGLU forward; then blockwise vs tensorwise end to end
     timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       tests/test_turbo_swiglu.py > "$OUT/pytest_gpu4.log" 2>&1
     tail -6 "$OUT/pytest_gpu4.log"
     timeout 200 python bench/turbo_kernels.py --no-tests --gpu-time --budget 190 --only fp8_casts,swiglu,fp8_linear \
       > "$OUT/kernels4.log" 2>&1
     grep -E "^\| |breakdown|^     " "$OUT/kernels4.log"
     L=$((585 - SECONDS))
     [ $L -gt 100 ] && timeout $L python bench/e2e.py --suite none --tag fp8_blockwise --timeout 90 --log-dir "$LOGS" \
       --ref "fp8 tensorwise" --extra "fp8 tensorwise=experiment=llama3_2_1b_megatron_fp8 $B" \
       --extra "fp8 blockwise=experiment=llama3_2_1b_megatron_fp8 precision=fp8_blockwise $B" \
       > "$OUT/fp8_blockwise.log" 2>&1
     grep -E "^\| " "$OUT/fp8_blockwise.log" ;;
  5) # call 4's pytest stopped at its 200 s limit after test_turbo_fp8.py (all passed) and 5 SwiGLU tests; the
     # autotune of _common.Tuned now times on the device (queued_gpu_time): each tuned space's configs vs the pick
     timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_swiglu.py \
       > "$OUT/pytest_gpu5.log" 2>&1
     tail -4 "$OUT/pytest_gpu5.log"
     L=$((560 - SECONDS))
     timeout $L python bench/turbo_kernels.py --no-tests --gpu-time --budget $((L - 10)) \
       --only tuned_spaces,fp8_casts,swiglu,fp8_linear > "$OUT/kernels5.log" 2>&1
     grep -E "^\| |breakdown|^     " "$OUT/kernels5.log" ;;
  *) echo "usage: bash bench/session6.sh 1|2|3|4|5" >&2; exit 2 ;;
esac
