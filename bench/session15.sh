#!/usr/bin/env bash
# Session 15's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
#   bash bench/session15.sh 1   # the fused fp8 SwiGLU MLP: its tests and the SwiGLU tests on the GPU, then
#                               # bench/fp8_mlp_ab.py (the SwiGLU kernels' amax outputs, the one-pass casts, the MLP
#                               # fwd+bwd fused vs unfused at Llama-3-8B and Llama-3.2-1B shapes)
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8_mlp.py \
       tests/test_turbo_swiglu.py > "$OUT/pytest_gpu1.log" 2>&1
     tail -3 "$OUT/pytest_gpu1.log"
     timeout 300 python bench/fp8_mlp_ab.py > "$OUT/fp8_mlp_ab.log" 2>&1
     grep -E "^\||copy|bit-equal|Error|error" "$OUT/fp8_mlp_ab.log" | tail -40 ;;
  *) echo "usage: bash bench/session15.sh 1" >&2; exit 2 ;;
esac
