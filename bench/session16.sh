#!/usr/bin/env bash
# Session 16's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
#   bash bench/session16.sh 1   # (run at commit 3415cf7, whose graph-amax code was reverted after it: 0.995x / 1.008x)
#                               # the fp8 tests on the GPU (custom ops, fused MLP, graph amax), then
#                               # bench/graph_amax_probe.py: a compiled layer stand-in, the tensorwise casts' amaxes
#                               # in the graph (fp8_ops.graph_amax) off vs on, per-kernel times
#   bash bench/session16.sh 3   # the rmsnorm / cross-entropy tests on the GPU (no zero fills), then
#                               # bench/absmax_probe.py: the tensorwise cast's amax pass, launch shapes and loop forms
#   bash bench/session16.sh 2   # (at commit 3415cf7; not run) end to end: experiment=llama3_2_1b_megatron_fp8,
#                               # precision.fp8_graph_amax false vs null (on), interleaved, one process per run
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 200 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8_mlp.py \
       tests/test_turbo_fp8_graph_amax.py > "$OUT/pytest_gpu1.log" 2>&1
     tail -3 "$OUT/pytest_gpu1.log"
     timeout 300 python bench/graph_amax_probe.py > "$OUT/graph_amax_probe.log" 2>&1
     grep -v "^\s*$" "$OUT/graph_amax_probe.log" | grep -v Warning | tail -80 ;;
  2) END=${BUDGET:-585}
     for tag in off1 on1 off2 on2 off3 on3; do
       [ $SECONDS -gt $((END - 125)) ] && break
       case $tag in off*) C=false ;; *) C=null ;; esac
       timeout 120 python bench/e2e.py --suite none --tag "gamax_$tag" --timeout 110 --log-dir /tmp/bench_logs \
         --ref "gamax $tag" --extra "gamax $tag=experiment=llama3_2_1b_megatron_fp8 training.train_iters=14 \
precision.fp8_graph_amax=$C" > "$OUT/gamax_$tag.log" 2>&1
       grep -E "^\| " "$OUT/gamax_$tag.log" | tail -1
       grep -h "graph amax\|Error" /tmp/bench_logs/gamax_$tag.log 2>/dev/null | grep -v "^\s*$" | head -2
     done ;;
  3) timeout 120 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_rmsnorm.py \
       tests/test_turbo_cross_entropy.py > "$OUT/pytest_gpu3.log" 2>&1
     tail -3 "$OUT/pytest_gpu3.log"
     timeout 300 python bench/absmax_probe.py > "$OUT/absmax_probe.log" 2>&1
     grep -v "^\s*$" "$OUT/absmax_probe.log" | grep -v Warn | tail -20 ;;
  *) echo "usage: bash bench/session16.sh 1|2|3" >&2; exit 2 ;;
esac
