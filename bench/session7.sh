#!/usr/bin/env bash
# Session 7's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl):
#   bash bench/session7.sh 1   # the fp8 tests on the GPU (custom-op fake kernels, compile), then GPU time of the
#                              # casts (the column amax pass now autotuned), the fp8 linear per recipe, tuned spaces
#   bash bench/session7.sh 2 BASE   # the portable fp8 linears inside compiled layers (custom ops) vs the session 6
#                              # code (graph break per linear) in the same call: BASE holds session 6's
#                              # primus/backends/megatron/{fp8,turbo}.py (carry it), swapped in for the "before" runs
#   bash bench/session7.sh 3   # the dy / dy^T cast with the bf16 tile transposed first (probe), TorchTitan turbo fp8
#                              # (the custom ops, moved to primus/turbo/fp8_ops.py) vs torchao float8, every turbo
#                              # kernel test on the GPU
#   bash bench/session7.sh 4 OLD   # the blockwise casts with dy^T from the transposed input tile vs OLD/fp8_linear.py
#                              # (session 6's), the blockwise tests on the GPU, the fp8 linear per recipe
# $OUT: logs, bench_*.md/json, pytest_gpu*.log
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
B="training.train_iters=14"
case "${1:-}" in
  1) timeout 240 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       > "$OUT/pytest_gpu1.log" 2>&1
     tail -6 "$OUT/pytest_gpu1.log"
     L=$((585 - SECONDS))
     timeout $L python bench/turbo_kernels.py --no-tests --gpu-time --budget $((L - 10)) \
       --only fp8_casts,tuned_spaces,fp8_linear > "$OUT/kernels1.log" 2>&1
     grep -E "^\| |breakdown|^     " "$OUT/kernels1.log" ;;
  2) BASE=${2:?usage: session7.sh 2 BASELINE_DIR}
     M=primus/backends/megatron
     runs() {  # $1: tag
       timeout 280 python bench/e2e.py --suite none --tag "fp8_compile_$1" --timeout 88 --log-dir "$LOGS" \
         --ref "fp8 tensorwise $1" --extra "fp8 tensorwise $1=experiment=llama3_2_1b_megatron_fp8 $B" \
         --extra "fp8 blockwise $1=experiment=llama3_2_1b_megatron_fp8 precision=fp8_blockwise $B" \
         --extra "fp8 tensorwise turbo $1=experiment=llama3_2_1b_megatron_fp8 turbo=megatron $B" \
         > "$OUT/fp8_compile_$1.log" 2>&1
       grep -E "^\| " "$OUT/fp8_compile_$1.log"
     }
     runs after
     cp $M/fp8.py /tmp/fp8_after.py && cp $M/turbo.py /tmp/turbo_after.py
     cp "$BASE/fp8.py" $M/fp8.py && cp "$BASE/turbo.py" $M/turbo.py
     runs before
     cp /tmp/fp8_after.py $M/fp8.py && cp /tmp/turbo_after.py $M/turbo.py ;;
  3) timeout 90 python bench/blockcast_probe.py --cases "dy and dy^T 1x128" > "$OUT/blockcast_probe3.md" 2>&1
     grep -E "production|transposed" "$OUT/blockcast_probe3.md"
     timeout 200 python bench/e2e.py --suite none --tag tt_fp8 --timeout 90 --log-dir "$LOGS" \
       --ref "torchtitan fp8 torchao" --extra "torchtitan fp8 torchao=experiment=llama3_2_1b_torchtitan_fp8" \
       --extra "torchtitan fp8 turbo=experiment=llama3_2_1b_torchtitan_fp8 turbo=torchtitan_fp8" \
       > "$OUT/tt_fp8.log" 2>&1
     grep -E "^\| " "$OUT/tt_fp8.log"
     L=$((590 - SECONDS))
     timeout $L python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_*.py \
       > "$OUT/pytest_gpu3.log" 2>&1
     tail -6 "$OUT/pytest_gpu3.log" ;;
  4) BASE=${2:?usage: session7.sh 4 BASELINE_DIR}
     timeout 150 python bench/blockcast_probe.py --baseline "$BASE/fp8_linear.py" > "$OUT/blockcast_probe4.md" 2>&1
     grep -E "^\| " "$OUT/blockcast_probe4.md"
     timeout 120 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       -k "block or fake or compile" > "$OUT/pytest_gpu4.log" 2>&1
     tail -3 "$OUT/pytest_gpu4.log"
     L=$((580 - SECONDS))
     timeout $L python bench/turbo_kernels.py --no-tests --gpu-time --budget $((L - 10)) --only fp8_linear \
       > "$OUT/kernels4.log" 2>&1
     grep -E "GEMMs total" "$OUT/kernels4.log" ;;
  *) echo "usage: bash bench/session7.sh 1|2 BASELINE_DIR|3|4 BASELINE_DIR" >&2; exit 2 ;;
esac
