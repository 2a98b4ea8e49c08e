#!/usr/bin/env bash
# Session 17's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl and
# outputs/baseline_s17: fp8_linear.py and fp8_ops.py of commit e5c07be, before the rowwise column amax change).
#   bash bench/session17.sh 1   # the rowwise / column amax fp8 tests on the GPU; bench/rowwise_colmax_probe.py (the
#                               # casts before vs after); bench/fp8_linear_ab.py --recipes rowwise (Llama-3-8B
#                               # layer's linears, this tree vs the baseline)
#   bash bench/session17.sh v   # bench/rowwise_colmax_variants.py: launch forms of the fused cast (after call 1
#                               # found production's slower than the plain cast + the column amax pass)
#   bash bench/session17.sh 2   # end to end: the megatron fp8 preset at precision=fp8_rowwise, after / before
#                               # interleaved (fp8_linear.py and fp8_ops.py swapped between runs)
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
BASE=outputs/baseline_s17
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       -k "rowwise or column_amax or fake_kernels or weight_casts" > "$OUT/pytest_gpu1.log" 2>&1
     tail -3 "$OUT/pytest_gpu1.log"
     timeout 200 python bench/rowwise_colmax_probe.py > "$OUT/colmax_probe.log" 2>&1
     grep -v "^\s*$" "$OUT/colmax_probe.log" | grep -v Warn | tail -12
     timeout $((590 - SECONDS)) python bench/fp8_linear_ab.py --baseline $BASE/fp8_linear.py --recipes rowwise \
       > "$OUT/fp8_linear_ab.log" 2>&1
     grep -v "^\s*$" "$OUT/fp8_linear_ab.log" | tail -12 ;;
  v) timeout 400 python bench/rowwise_colmax_variants.py > "$OUT/colmax_variants.log" 2>&1
     grep -v "^\s*$" "$OUT/colmax_variants.log" | grep -v -i warn | grep -v "^|---" | head -150 ;;
  2) B="experiment=llama3_2_1b_megatron_fp8 precision=fp8_rowwise training.train_iters=14"
     mkdir -p /tmp/after && cp primus/turbo/fp8_linear.py primus/turbo/fp8_ops.py /tmp/after/
     for tag in ${TAGS:-after1 before1 after2 before2}; do
       [ $SECONDS -gt $((590 - 140)) ] && break
       case $tag in after*) S=/tmp/after ;; *) S=$BASE ;; esac
       cp $S/fp8_linear.py $S/fp8_ops.py primus/turbo/
       timeout 140 python bench/e2e.py --suite none --tag "rw_$tag" --timeout 125 --log-dir /tmp/bench_logs \
         --ref "rowwise $tag" --extra "rowwise $tag=$B" > "$OUT/rw_$tag.log" 2>&1
       grep -E "^\| " "$OUT/rw_$tag.log" | tail -1
     done
     cp /tmp/after/fp8_linear.py /tmp/after/fp8_ops.py primus/turbo/ ;;
  *) echo "usage: bash bench/session17.sh 1|2" >&2; exit 2 ;;
esac
