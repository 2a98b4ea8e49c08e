#!/usr/bin/env bash
# Session 15's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
#   bash bench/session15.sh 1   # the fused fp8 SwiGLU MLP: its tests and the SwiGLU tests on the GPU, then
#                               # bench/fp8_mlp_ab.py (the SwiGLU kernels' amax outputs, the one-pass casts, the MLP
#                               # fwd+bwd fused vs unfused at Llama-3-8B and Llama-3.2-1B shapes), then step 2
#   bash bench/session15.sh 2   # end to end: experiment=llama3_2_1b_megatron_fp8, precision.fp8_fused_mlp false vs
#                               # null (on), interleaved, one process per run, while the call's budget lasts
#   bash bench/session15.sh 3   # after the zero-gradient fix of the fp8 custom ops: fp8_mlp_ab.py's MLP pairs (fills
#                               # before / after, unfused / fused) with per-kernel times, then the preset eagerly
#                               # (training.compile=false), precision.fp8_fused_mlp false vs null, interleaved
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8_mlp.py \
       tests/test_turbo_swiglu.py > "$OUT/pytest_gpu1.log" 2>&1
     tail -3 "$OUT/pytest_gpu1.log"
     timeout 300 python bench/fp8_mlp_ab.py > "$OUT/fp8_mlp_ab.log" 2>&1
     grep -E "^\||copy|bit-equal|Error|error" "$OUT/fp8_mlp_ab.log" | tail -40
     BUDGET=$((585 - SECONDS)) bash "$0" 2 ;;
  2) END=${BUDGET:-585}
     for tag in off1 on1 off2 on2 off3 on3; do
       [ $SECONDS -gt $((END - 125)) ] && break
       case $tag in off*) C=false ;; *) C=null ;; esac
       timeout 120 python bench/e2e.py --suite none --tag "mlp_$tag" --timeout 110 --log-dir /tmp/bench_logs \
         --ref "mlp $tag" --extra "mlp $tag=experiment=llama3_2_1b_megatron_fp8 training.train_iters=14 \
precision.fp8_fused_mlp=$C" > "$OUT/mlp_$tag.log" 2>&1
       grep -E "^\| " "$OUT/mlp_$tag.log" | tail -1
       grep -h "MLPs fused\|Error" /tmp/bench_logs/mlp_$tag.log 2>/dev/null | grep -v "^\s*$" | head -2
     done ;;
  3) timeout 240 python bench/fp8_mlp_ab.py --no-kernels --breakdown --fmts e4m3 > "$OUT/fp8_mlp_ab3.log" 2>&1
     grep -E "^\||copy|kernels|^  |Error|error" "$OUT/fp8_mlp_ab3.log" | grep -v "^|---" | tail -70
     for tag in off1 on1 off2 on2; do
       [ $SECONDS -gt $((585 - 125)) ] && break
       case $tag in off*) C=false ;; *) C=null ;; esac
       timeout 120 python bench/e2e.py --suite none --tag "eager_$tag" --timeout 110 --log-dir /tmp/bench_logs \
         --ref "eager $tag" --extra "eager $tag=experiment=llama3_2_1b_megatron_fp8 training.train_iters=12 \
training.compile=false training.micro_batch_size=8 training.global_batch_size=8 precision.fp8_fused_mlp=$C" > "$OUT/eager_$tag.log" 2>&1
       grep -E "^\| " "$OUT/eager_$tag.log" | tail -1
     done ;;
  *) echo "usage: bash bench/session15.sh 1|2|3" >&2; exit 2 ;;
esac
