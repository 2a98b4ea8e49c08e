#!/usr/bin/env bash
# The megatron backend's Triton fusions (model.apply_rope_fusion: q/k/v split + RoPE; model.bias_activation_fusion:
# SwiGLU) on vs off, bf16 and fp8, next to the compiled reference and its float8 variant.
# Llama-3.2-1B shape, seq 4096, micro batch 8, training.compile=true. One GPU, ~8 min:
#   bash bench/megatron_fusions.sh      # $OUT/bench_fusions.md/json
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
MEG="backend=megatron training.compile=true"
OFF="model.apply_rope_fusion=false model.bias_activation_fusion=false"
python bench/e2e.py --suite reference --only reference/compile_fused reference/float8 --tag fusions --timeout 170 --log-dir "$LOGS" \
  --extra "megatron bf16 fusions off=$MEG $OFF" \
  --extra "megatron bf16=$MEG" \
  --extra "megatron fp8 fusions off=$MEG precision=fp8 $OFF" \
  --extra "megatron fp8=$MEG precision=fp8"
