#!/usr/bin/env bash
# Issue 10's comparison in one device call: the plain-PyTorch reference (compiled + fused AdamW; + torchao float8)
# and both backends through the experiment presets users run (Llama-3.2-1B shape, seq 4096, micro batch 8), plus
# the megatron bf16 preset again with the default TensorBoard sink on (issue 12: observability cost).
#   bash bench/final.sh              # $OUT/bench_final.md/json
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
python bench/e2e.py --suite reference --only reference/compile_fused reference/float8 --tag final --timeout 170 \
  --log-dir "$LOGS" \
  --extra "megatron bf16=experiment=llama3_2_1b_megatron_bf16" \
  --extra "megatron bf16 + tensorboard=experiment=llama3_2_1b_megatron_bf16 logging.tensorboard=true" \
  --extra "megatron fp8=experiment=llama3_2_1b_megatron_fp8" \
  --extra "torchtitan bf16=experiment=llama3_2_1b_torchtitan_bf16" \
  --extra "torchtitan fp8=experiment=llama3_2_1b_torchtitan_fp8"
