#!/usr/bin/env bash
# Session 8's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl):
#   bash bench/session8.sh 1   # cuBLASLt candidates vs torch's pick for the blockwise fp8 GEMMs (lt_blockwise_probe),
#                              # the dy / dy^T cast as a persistent pipelined kernel (blockcast_probe --persistent)
#   bash bench/session8.sh 2   # the tensorwise cast pass autotuned: its GPU tests, every config alone vs the pick
#                              # (the first config is the old fixed 64x64 tile), casts, the fp8 linear per recipe
#   bash bench/session8.sh 3   # call 2 again with the amax pass autotuned too (bigger blocks: slower, reverted)
#   bash bench/session8.sh 4 BASE   # the delayed recipe as custom ops inside the compiled layers: its GPU tests, the
#                              # fp8 presets end to end, then the delayed preset with BASE's fp8_linear.py,
#                              # fp8_ops.py and megatron fp8.py / turbo.py (the graph-break code, carried; swapped in)
#   bash bench/session8.sh 5 BASE   # the tensorwise preset with this tree's fp8_linear.py vs BASE's (session 7's:
#                              # the fixed 64x64 cast tile), then every turbo test file on the GPU
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
     timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       -k "delayed" > "$OUT/pytest_gpu4.log" 2>&1
     tail -3 "$OUT/pytest_gpu4.log"
     FILES="primus/turbo/fp8_linear.py primus/turbo/fp8_ops.py primus/backends/megatron/fp8.py primus/backends/megatron/turbo.py"
     B="training.train_iters=14"
     runs() {  # $1: tag, then "name=overrides" pairs
       local tag=$1; shift
       local args=()
       for e in "$@"; do args+=(--extra "$e"); done
       timeout 400 python bench/e2e.py --suite none --tag "fp8_$tag" --timeout 88 --log-dir /tmp/bench_logs \
         --ref "${1%%=*}" "${args[@]}" > "$OUT/fp8_$tag.log" 2>&1
       grep -E "^\| " "$OUT/fp8_$tag.log"
     }
     runs after "fp8 delayed after=experiment=llama3_2_1b_megatron_fp8_delayed $B" \
       "fp8 tensorwise after=experiment=llama3_2_1b_megatron_fp8 $B" \
       "fp8 delayed turbo after=experiment=llama3_2_1b_megatron_fp8_delayed turbo=megatron $B"
     mkdir -p /tmp/after && for f in $FILES; do cp $f /tmp/after/$(basename $f); cp "$BASE/$(basename $f)" $f; done
     runs before "fp8 delayed before=experiment=llama3_2_1b_megatron_fp8_delayed $B"
     for f in $FILES; do cp /tmp/after/$(basename $f) $f; done ;;
  5) BASE=${2:?usage: session8.sh 5 BASELINE_DIR}
     F=primus/turbo/fp8_linear.py
     B="training.train_iters=14"
     timeout 200 python bench/e2e.py --suite none --tag fp8_tw_after --timeout 88 --log-dir /tmp/bench_logs \
       --ref "fp8 tensorwise after" --extra "fp8 tensorwise after=experiment=llama3_2_1b_megatron_fp8 $B" \
       > "$OUT/fp8_tw_after.log" 2>&1
     grep -E "^\| " "$OUT/fp8_tw_after.log"
     cp $F /tmp/fp8_linear_after.py && cp "$BASE/fp8_linear.py" $F
     timeout 200 python bench/e2e.py --suite none --tag fp8_tw_before --timeout 88 --log-dir /tmp/bench_logs \
       --ref "fp8 tensorwise before" --extra "fp8 tensorwise before=experiment=llama3_2_1b_megatron_fp8 $B" \
       > "$OUT/fp8_tw_before.log" 2>&1
     grep -E "^\| " "$OUT/fp8_tw_before.log"
     cp /tmp/fp8_linear_after.py $F
     L=$((590 - SECONDS))
     timeout $L python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_*.py \
       > "$OUT/pytest_gpu5.log" 2>&1
     tail -6 "$OUT/pytest_gpu5.log" ;;
  *) echo "usage: session8.sh 1|2|3|4 BASE|5 BASE" >&2; exit 2 ;;
esac
