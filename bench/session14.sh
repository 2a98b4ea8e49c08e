#!/usr/bin/env bash
# Session 14's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
#   bash bench/session14.sh 1   # the weight-cache tests on the GPU (the delayed case's reference now starts from the
#                               # cached run's amax histories), then session 13's call 2: the megatron fp8 preset
#                               # with 4 micro batches, precision.fp8_weight_cache false vs null, interleaved
#   bash bench/session14.sh 2   # the experts' fp8 weight casts cached too: the fp8 grouped GEMM tests on the GPU
#                               # (the real torch._scaled_grouped_mm), expert_cache_ab.py (off vs on per provider
#                               # at three models' expert shapes), then experiment=mixtral_small_moe_fp8 (2 micro
#                               # batches: the cache now on by default) with fp8_weight_cache false vs null
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 100 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       -k "weight_casts" > "$OUT/pytest_gpu1.log" 2>&1
     tail -3 "$OUT/pytest_gpu1.log"
     BUDGET=$((585 - SECONDS)) bash bench/session13.sh 2 ;;
  2) timeout 120 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_grouped_gemm_fp8.py > "$OUT/pytest_gpu2.log" 2>&1
     tail -3 "$OUT/pytest_gpu2.log"
     timeout 200 python bench/expert_cache_ab.py > "$OUT/expert_cache_ab.log" 2>&1
     grep -E "^\||^[a-z0-9_]+:$|copy|Error|error" "$OUT/expert_cache_ab.log" | tail -24
     for tag in off1 on1 off2 on2; do
       [ $SECONDS -gt $((540 - 120)) ] && break
       case $tag in off*) C=false ;; *) C=null ;; esac
       timeout 120 python bench/e2e.py --suite none --tag "moe_$tag" --timeout 110 --log-dir /tmp/bench_logs \
         --ref "moe $tag" --extra "moe $tag=experiment=mixtral_small_moe_fp8 training.train_iters=12 \
precision.fp8_weight_cache=$C" > "$OUT/moe_$tag.log" 2>&1
       grep -E "^\| " "$OUT/moe_$tag.log" | tail -1
     done ;;
  *) echo "usage: bash bench/session14.sh 1|2" >&2; exit 2 ;;
esac
