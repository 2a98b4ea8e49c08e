#!/usr/bin/env bash
# Turbo end to end (~8 min on one H200): turbo on vs off on the megatron backend, same model, same
# run. Dense: the bf16 and fp8 delayed presets with `turbo=megatron` (attention, RMSNorm, parallel linear) vs
# without, compiled as the presets ship, and the bf16 one eager. MoE: `experiment=mixtral_small_moe` with
# `turbo=megatron_moe` (+ grouped GEMM, fused router, fused act with probs) and `moe.moe_permute_fusion=true` vs
# without, and the fp8 MoE preset (`experiment=mixtral_small_moe_fp8`: + fp8 experts); its ratio to the turbo MoE
# bf16 run is the two rows' quotient. The reference column is each part's "off" run.
#   bash bench/turbo_e2e.sh [dense|eager|moe]   # default: all three; $OUT/bench_turbo_<part>.md (+ json)
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
B="training.train_iters=14"
PART=${1:-all}
case "$PART" in all|dense|eager|moe) ;; *) echo "usage: bash bench/turbo_e2e.sh [dense|eager|moe]" >&2; exit 2 ;; esac
if [ "$PART" = all ] || [ "$PART" = dense ]; then
  timeout 330 python bench/e2e.py --suite none --tag turbo_dense --timeout 80 --log-dir "$LOGS" --ref "bf16 turbo off" \
    --extra "bf16 turbo off=experiment=llama3_2_1b_megatron_bf16 $B" \
    --extra "bf16 turbo on=experiment=llama3_2_1b_megatron_bf16 turbo=megatron $B" \
    --extra "fp8 delayed turbo off=experiment=llama3_2_1b_megatron_fp8_delayed $B" \
    --extra "fp8 delayed turbo on=experiment=llama3_2_1b_megatron_fp8_delayed turbo=megatron $B" \
    > "$OUT/turbo_dense.log" 2>&1
  grep -E "^\| " "$OUT/turbo_dense.log"
fi
if [ "$PART" = all ] || [ "$PART" = eager ]; then
  # eager (training.compile=false): what the turbo kernels replace is then torch's unfused ops, not inductor's
  # fusions (micro batch 8: 16 does not fit eagerly without recompute)
  E="experiment=llama3_2_1b_megatron_bf16 training.compile=false training.micro_batch_size=8 training.global_batch_size=8 $B"
  timeout 200 python bench/e2e.py --suite none --tag turbo_eager --timeout 90 --log-dir "$LOGS" --ref "bf16 eager turbo off" \
    --extra "bf16 eager turbo off=$E" --extra "bf16 eager turbo on=$E turbo=megatron" > "$OUT/turbo_eager.log" 2>&1
  grep -E "^\| " "$OUT/turbo_eager.log"
fi
if [ "$PART" = all ] || [ "$PART" = moe ]; then
  timeout 300 python bench/e2e.py --suite none --tag turbo_moe --timeout 90 --log-dir "$LOGS" --ref "moe turbo off" \
    --extra "moe turbo off=experiment=mixtral_small_moe $B" \
    --extra "moe turbo on=experiment=mixtral_small_moe turbo=megatron_moe moe.moe_permute_fusion=true $B" \
    --extra "moe fp8 preset=experiment=mixtral_small_moe_fp8 $B" \
    > "$OUT/turbo_moe.log" 2>&1
  grep -E "^\| " "$OUT/turbo_moe.log"
fi
