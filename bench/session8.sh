#!/usr/bin/env bash
# Session 8's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl):
#   bash bench/session8.sh 1   # cuBLASLt candidates vs torch's pick for the blockwise fp8 GEMMs (lt_blockwise_probe),
#                              # the dy / dy^T cast as a persistent pipelined kernel (blockcast_probe --persistent)
#   bash bench/session8.sh 2   # the tensorwise cast pass autotuned: its GPU tests, every config alone vs the pick
#                              # (the first config is the old fixed 64x64 tile), casts, the fp8 linear per recipe
#   bash bench/session8.sh 3   # call 2 again with the amax pass autotuned too (bigger blocks), its GPU tests
#   bash bench/session8.sh 4 BASE   # end to end, the fp8 presets (tensorwise, delayed) with this tree's casts vs
#                              # BASE/fp8_linear.py (session 7's, carried; swapped in for the "before" runs)
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 330 python bench/lt_blockwise_probe.py --max-candidates 40 > "$OUT/lt_probe.log" 2>&1
     cat "$OUT/lt_probe.log" | grep -v "^\s*$" | tail -30
     timeout $((585 - SECONDS)) python bench/blockcast_probe.py --persistent --cases "dy and dy^T 1x128" \
       --shapes 8192x4096,8192x14336 > "$OUT/blockcast.log" 2>&1
     grep -E "^\| " "$OUT/blockcast.log" ;;
  2|3) timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       -k "tensorwise or delayed or fp8_linear or amax" > "$OUT/pytest_gpu2.log" 2>&1
     tail -4 "$OUT/pytest_gpu2.log"
     L=$((585 - SECONDS))
     timeout $L python bench/turbo_kernels.py --no-tests --gpu-time --budget $((L - 10)) \
       --only fp8_casts,tuned_spaces,fp8_linear > "$OUT/kernels2.log" 2>&1
     grep -E "^\| |breakdown|^     " "$OUT/kernels2.log" | grep -v "tuned blockwise\|tuned swiglu\|tuned column\|along M" ;;
  4) BASE=${2:?usage: session8.sh 4 BASELINE_DIR}
     F=primus/turbo/fp8_linear.py
     B="training.train_iters=14"
     runs() {  # $1: tag
       timeout 270 python bench/e2e.py --suite none --tag "fp8_casts_$1" --timeout 88 --log-dir /tmp/bench_logs \
         --ref "fp8 tensorwise $1" --extra "fp8 tensorwise $1=experiment=llama3_2_1b_megatron_fp8 $B" \
         --extra "fp8 delayed $1=experiment=llama3_2_1b_megatron_fp8_delayed $B" > "$OUT/fp8_casts_$1.log" 2>&1
       grep -E "^\| " "$OUT/fp8_casts_$1.log"
     }
     runs after
     cp $F /tmp/fp8_linear_after.py && cp "$BASE/fp8_linear.py" $F
     runs before
     cp /tmp/fp8_linear_after.py $F ;;
  *) echo "usage: session8.sh 1|2|3|4 BASE" >&2; exit 2 ;;
esac
