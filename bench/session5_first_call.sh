#!/usr/bin/env bash
# What session 4 left for the H200, one device call (<= 600 s):
#  1. the autotuned RMSNorm forward, rowwise fp8 cast and MoE router, the one-store MoE permute (session 4,
#     unmeasured): their GPU tests and speed rows against eager / torch.compile (issue 5: >= 1.0x compile, >= 70%
#     of copy bandwidth);
#  2. issue 10's comparison once more: the compiled reference, the bf16 preset, the bf16 preset with tuned GEMMs
#     when a stage-2 results file was carried in outputs/tune_hipblaslt (skipped otherwise;
#     bench/gemm_tuning_megatron.sh makes one), the fp8 delayed preset and the float8 reference.
#   bash bench/session5_first_call.sh      # $OUT: kernels.log, e2e.log, bench_session5.md/json
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
timeout 200 python bench/turbo_kernels.py --only rmsnorm,fp8_casts,permute,router --test-files rmsnorm,fp8,moe_ops \
  --budget 190 --test-timeout 100 > "$OUT/kernels.log" 2>&1
grep -E "^\| |pytest on GPU" "$OUT/kernels.log" | tail -14
RES=outputs/tune_hipblaslt/llama3_2_1b/gemm_tune/tune_hipblas_gemm_results.txt
TUNED=()
if [ -f "$RES" ]; then
  TUNED=(--extra "megatron bf16 preset tuned GEMMs=experiment=llama3_2_1b_megatron_bf16 tuning.enabled=true tuning_stage=3")
fi
timeout 360 python bench/e2e.py --suite reference --only reference/compile_fused reference/float8 --tag session5 \
  --timeout 95 --log-dir "$LOGS" \
  --extra "megatron bf16 preset=experiment=llama3_2_1b_megatron_bf16" "${TUNED[@]}" \
  --extra "megatron fp8 delayed preset=experiment=llama3_2_1b_megatron_fp8_delayed" \
  > "$OUT/e2e.log" 2>&1
grep -E "^\| " "$OUT/e2e.log"
