#!/usr/bin/env bash
# Session 12's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
#   bash bench/session12.sh 1   # the transposed casts in Gluon vs production (bench/gluon_cast_probe.py), then the
#                               # tests/test_turbo_*.py files session 11's last call did not reach
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
  *) echo "usage: bash bench/session12.sh 1" >&2; exit 2 ;;
esac
