#!/usr/bin/env bash
# Session 11's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl; BASE carried too).
#   bash bench/session11.sh 1        # the casts without their clamp (bench/cast_sat_probe.py), then the delayed
#                                    # cast's recording variants (bench/delayed_record_probe.py); on 11a3cc7
#   bash bench/session11.sh 2 BASE   # this tree's casts and fp8 linears vs BASE's fp8_linear.py
#                                    # (cast_sat_probe.py --baseline, fp8_linear_ab.py), then test_turbo_fp8.py
#   bash bench/session11.sh 3 BASE   # the blockwise wgrad in both orientations (wgrad_orientation_probe.py); end to
#                                    # end, 14 steps: the megatron delayed and blockwise presets, this tree vs BASE's
#                                    # fp8_linear.py swapped in
#   bash bench/session11.sh 4 BASE BASE2   # the casts vs BASE2's fp8_linear.py, the fp8 linears vs BASE's, then the
#                                    # blockwise / clamp tests of test_turbo_fp8.py
#   bash bench/session11.sh 5 BASE2  # the blockwise casts vs BASE2's (tiles back on the exact division), then every
#                                    # tests/test_turbo_*.py file on the GPU
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 300 python bench/cast_sat_probe.py > "$OUT/sat_probe.log" 2>&1
     grep -E "^\||copy|PTX|Error|error" "$OUT/sat_probe.log" | tail -40
     timeout $((590 - SECONDS)) python bench/delayed_record_probe.py > "$OUT/record_probe.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/record_probe.log" | tail -40 ;;
  2) BASE=${2:?usage: session11.sh 2 BASELINE_DIR}
     timeout 150 python bench/cast_sat_probe.py --baseline "$BASE/fp8_linear.py" > "$OUT/cast_ab.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/cast_ab.log" | tail -40
     timeout 200 python bench/fp8_linear_ab.py --baseline "$BASE/fp8_linear.py" > "$OUT/linear_ab.log" 2>&1
     grep -E "^\||total|Error|error" "$OUT/linear_ab.log" | tail -20
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py > "$OUT/pytest_gpu2.log" 2>&1
     tail -4 "$OUT/pytest_gpu2.log" ;;
  3) BASE=${2:?usage: session11.sh 3 BASELINE_DIR}
     timeout 90 python bench/wgrad_orientation_probe.py > "$OUT/wgrad_probe.log" 2>&1
     grep -E "^\||Error|error" "$OUT/wgrad_probe.log" | tail -12
     F=primus/turbo/fp8_linear.py
     B="training.train_iters=14"
     runs() {  # $1: tag, then "name=overrides" pairs
       local tag=$1; shift
       local args=()
       for e in "$@"; do args+=(--extra "$e"); done
       timeout 260 python bench/e2e.py --suite none --tag "fp8_$tag" --timeout 88 --log-dir /tmp/bench_logs \
         --ref "${1%%=*}" "${args[@]}" > "$OUT/fp8_$tag.log" 2>&1
       grep -E "^\| " "$OUT/fp8_$tag.log"
     }
     runs after "fp8 delayed after=experiment=llama3_2_1b_megatron_fp8_delayed $B" \
       "fp8 blockwise after=experiment=llama3_2_1b_megatron_fp8 precision=fp8_blockwise $B"
     cp $F /tmp/fp8_linear_after.py && cp "$BASE/fp8_linear.py" $F
     runs before "fp8 delayed before=experiment=llama3_2_1b_megatron_fp8_delayed $B" \
       "fp8 blockwise before=experiment=llama3_2_1b_megatron_fp8 precision=fp8_blockwise $B"
     cp /tmp/fp8_linear_after.py $F ;;
  4) BASE=${2:?usage: session11.sh 4 BASELINE_DIR BASELINE2_DIR}; BASE2=${3:?}
     timeout 150 python bench/cast_sat_probe.py --baseline "$BASE2/fp8_linear.py" > "$OUT/cast_ab4.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/cast_ab4.log" | grep -v "rowwise\|tensorwise" | tail -30
     timeout 200 python bench/fp8_linear_ab.py --baseline "$BASE/fp8_linear.py" --recipes delayed,blockwise \
       > "$OUT/linear_ab4.log" 2>&1
     grep -E "^\||total|Error|error" "$OUT/linear_ab4.log" | tail -12
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py -k "block or delayed" > "$OUT/pytest_gpu4.log" 2>&1
     tail -4 "$OUT/pytest_gpu4.log" ;;
  5) BASE2=${2:?usage: session11.sh 5 BASELINE2_DIR}
     timeout 100 python bench/cast_sat_probe.py --baseline "$BASE2/fp8_linear.py" --shapes 8192x4096,8192x14336 \
       > "$OUT/cast_ab5.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/cast_ab5.log" | grep "blockwise\|copy\|rror" | tail -12
     timeout $((530 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_*.py > "$OUT/pytest_gpu5.log" 2>&1
     tail -6 "$OUT/pytest_gpu5.log" ;;
  *) echo "usage: bash bench/session11.sh 1|2 BASE|3 BASE|4 BASE BASE2|5 BASE2" >&2; exit 2 ;;
esac
