#!/usr/bin/env bash
# Session 16's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
#   Step 1 ran at commit 3415cf7 (the graph amax, reverted after it in f117d96):
#     git checkout 3415cf7 && bash bench/session16.sh 1   # the fp8 tests on the GPU, then bench/graph_amax_probe.py
#   bash bench/session16.sh 3   # the rmsnorm / cross-entropy tests on the GPU (no zero fills), then
#                               # bench/absmax_probe.py: the tensorwise cast's amax pass, launch shapes and loop forms
#   The profile of the fp8 preset (docs/benchmarks.md, session 16) is train.py's own:
#     python train.py experiment=llama3_2_1b_megatron_fp8 training.train_iters=9 profile.enabled=true \
#       profile.start_step=6 profile.steps=2 profile.top_kernels=30
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  3) timeout 120 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_rmsnorm.py \
       tests/test_turbo_cross_entropy.py > "$OUT/pytest_gpu3.log" 2>&1
     tail -3 "$OUT/pytest_gpu3.log"
     timeout 300 python bench/absmax_probe.py > "$OUT/absmax_probe.log" 2>&1
     grep -v "^\s*$" "$OUT/absmax_probe.log" | grep -v Warn | tail -20 ;;
  *) echo "usage: bash bench/session16.sh 3 (step 1: at commit 3415cf7)" >&2; exit 2 ;;
esac
