#!/usr/bin/env bash
# Session 13's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl). Written in session
# 13, which had no device time left; for the next session with a GPU.
#   bash bench/session13.sh 1   # the fp8 weight cache off vs on per recipe, 4 micro batches of 2048 tokens, at the
#                               # Llama-3-8B layer's linears (weight_cache_ab.py); the rowwise backward's column
#                               # amax from the rowwise cast (rowwise_colmax_probe.py); the weight-cache tests
#   bash bench/session13.sh 2   # end to end: the megatron fp8 preset with 4 micro batches of 4 (global batch 16,
#                               # the preset's tokens per step), precision.fp8_weight_cache false vs null (on),
#                               # interleaved, precision=fp8 (hybrid tensorwise) then fp8_blockwise
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 240 python bench/weight_cache_ab.py > "$OUT/weight_cache_ab.log" 2>&1
     grep -E "^\||copy|total|Error|error" "$OUT/weight_cache_ab.log" | tail -14
     timeout 150 python bench/rowwise_colmax_probe.py > "$OUT/colmax_probe.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/colmax_probe.log" | tail -20
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py -k "weight_casts or fp8_linear" > "$OUT/pytest_gpu1.log" 2>&1
     tail -4 "$OUT/pytest_gpu1.log" ;;
  2) END=${BUDGET:-590}  # seconds this call may take (a call that runs something first passes less)
     B="experiment=llama3_2_1b_megatron_fp8 training.train_iters=14 training.micro_batch_size=4"
     for recipe in fp8 fp8_blockwise; do
       for tag in off1 on1 off2 on2; do
         [ $SECONDS -gt $((END - 130)) ] && break 2
         case $tag in off*) C=false ;; *) C=null ;; esac
         timeout 130 python bench/e2e.py --suite none --tag "wc_${recipe}_$tag" --timeout 110 \
           --log-dir /tmp/bench_logs --ref "$recipe $tag" \
           --extra "$recipe $tag=$B precision=$recipe precision.fp8_weight_cache=$C" \
           > "$OUT/wc_${recipe}_$tag.log" 2>&1
         grep -E "^\| " "$OUT/wc_${recipe}_$tag.log" | tail -1
       done
     done ;;
  *) echo "usage: bash bench/session13.sh 1|2" >&2; exit 2 ;;
esac
