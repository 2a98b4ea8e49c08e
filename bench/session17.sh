#!/usr/bin/env bash
# Session 17's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl; step 1 also
# outputs/baseline_s17: fp8_linear.py of commit e5c07be, before the rowwise column amax change).
#   Step 1 ran at commit 1e66ac0 (the rowwise casts keeping the column amax, in production then; slower, so reverted
#   after step v):  git checkout 1e66ac0 && bash bench/session17.sh 1   # the rowwise / column amax fp8 tests on the
#     GPU; that commit's bench/rowwise_colmax_probe.py (the casts before vs after); bench/fp8_linear_ab.py
#     --recipes rowwise (Llama-3-8B layer's linears, that tree vs the baseline)
#   bash bench/session17.sh v   # bench/rowwise_colmax_variants.py: launch forms of the fused cast (integer / relaxed
#                               # atomics, partials, prefetch, a 16-bit running max) against the plain cast + pass
#   bash bench/session17.sh c   # bench/colmax_pass_probe.py: launch forms of the column amax pass itself
#   bash bench/session17.sh p   # production's column amax pass with the probe's forms added to its space vs e5c07be
#                               # (bench/colmax_ab.py), the rowwise linear A/B, the rowwise fp8 tests on the GPU
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  v) timeout 400 python bench/rowwise_colmax_variants.py > "$OUT/colmax_variants.log" 2>&1
     grep -v "^\s*$" "$OUT/colmax_variants.log" | grep -v -i warn | grep -v "^|---" | head -150 ;;
  c) timeout 300 python bench/colmax_pass_probe.py > "$OUT/colmax_pass.log" 2>&1
     grep -v "^\s*$" "$OUT/colmax_pass.log" | grep -v -i warn | grep -v "^|---" | head -170 ;;
  p) timeout 120 python bench/colmax_ab.py --baseline outputs/baseline_s17/fp8_linear.py > "$OUT/colmax_ab.log" 2>&1
     grep -E "^\||copy|Error" "$OUT/colmax_ab.log" | tail -9
     timeout 130 python bench/fp8_linear_ab.py --baseline outputs/baseline_s17/fp8_linear.py --recipes rowwise \
       > "$OUT/fp8_linear_ab.log" 2>&1
     grep -E "^\||bf16 total" "$OUT/fp8_linear_ab.log" | tail -5
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py -k "column_amax or rowwise or fp8_linear" > "$OUT/pytest_gpu_p.log" 2>&1
     tail -3 "$OUT/pytest_gpu_p.log" ;;
  *) echo "usage: bash bench/session17.sh v|c|p (step 1: at commit 1e66ac0)" >&2; exit 2 ;;
esac
