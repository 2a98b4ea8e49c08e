#!/usr/bin/env bash
# Session 12's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
#   bash bench/session12.sh 1   # the transposed casts in Gluon vs production (bench/gluon_cast_probe.py), then the
#                               # tests/test_turbo_*.py files session 11's last call did not reach
#   bash bench/session12.sh 2 BASE   # production's dy, dy^T cast with / without fp8_cast_gluon, small to large
#                               # (gluon_cast_probe.py --threshold); the blockwise linear vs BASE's fp8_linear.py
#                               # (fp8_linear_ab.py); the blockwise tests of test_turbo_fp8.py
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 240 python bench/gluon_cast_probe.py > "$OUT/gluon_probe.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/gluon_probe.log" | tail -40
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_moe_ops.py tests/test_turbo_parallel_linear.py tests/test_turbo_providers.py \
       tests/test_turbo_rmsnorm.py tests/test_turbo_rope.py tests/test_turbo_swiglu.py > "$OUT/pytest_gpu1.log" 2>&1
     tail -6 "$OUT/pytest_gpu1.log" ;;
  2) BASE=${2:?usage: session12.sh 2 BASELINE_DIR}
     timeout 120 python bench/gluon_cast_probe.py --threshold > "$OUT/gluon_threshold.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/gluon_threshold.log" | tail -20
     timeout 150 python bench/fp8_linear_ab.py --baseline "$BASE/fp8_linear.py" --recipes blockwise \
       > "$OUT/linear_ab2.log" 2>&1
     grep -E "^\||total|Error|error" "$OUT/linear_ab2.log" | tail -12
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py -k "gluon or block" > "$OUT/pytest_gpu2.log" 2>&1
     tail -4 "$OUT/pytest_gpu2.log" ;;
  3) BASE=${2:?usage: session12.sh 3 BASELINE_DIR}
     F=primus/turbo/fp8_linear.py
     B="experiment=llama3_2_1b_megatron_fp8 precision=fp8_blockwise training.train_iters=14"
     cp $F /tmp/fp8_linear_after.py
     for tag in ${TAGS:-after1 before1 after2 before2}; do
       [ $SECONDS -gt $((590 - 150)) ] && break
       case $tag in after*) cp /tmp/fp8_linear_after.py $F ;; *) cp "$BASE/fp8_linear.py" $F ;; esac
       timeout 150 python bench/e2e.py --suite none --tag "fp8_$tag" --timeout 120 --log-dir /tmp/bench_logs \
         --ref "blockwise $tag" --extra "blockwise $tag=$B" > "$OUT/fp8_$tag.log" 2>&1
       grep -E "^\| " "$OUT/fp8_$tag.log" | tail -1
     done
     cp /tmp/fp8_linear_after.py $F
     [ $SECONDS -lt 400 ] && timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging \
       --tb=short -rf tests/test_turbo_fp8.py > "$OUT/pytest_gpu3.log" 2>&1 && tail -4 "$OUT/pytest_gpu3.log" ;;
  4) timeout 200 python bench/cols_t_strip_probe.py --shapes 8192x4096,8192x14336,4096x4096,8192x28672,16384x4096 \
       > "$OUT/strip_probe.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/strip_probe.log" | tail -12
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py tests/test_turbo_frontend_compile.py > "$OUT/pytest_gpu4.log" 2>&1
     tail -4 "$OUT/pytest_gpu4.log" ;;
  *) echo "usage: bash bench/session12.sh 1|2 BASE|3 BASE|4" >&2; exit 2 ;;
esac
