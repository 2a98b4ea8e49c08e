#!/usr/bin/env bash
# Issue 6 on the real step, one device call (~8 min): the guide's three stages through train.py on the megatron
# bf16 preset at micro batch 8 (Llama-3.2-1B shape; the eager dump of stage 1 would not fit at 16), then the tuned and the default step side by side (same call,
# the default run twice to measure noise). "never slower" = tuned within the default runs' spread or faster.
#   bash bench/gemm_tuning_megatron.sh      # $OUT: stage logs, tune report, bench_gemm_e2e.md
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
M8="training.micro_batch_size=8 training.global_batch_size=8"
P="experiment=llama3_2_1b_megatron_bf16 $M8 tuning.enabled=true logging.tensorboard=false"
# stage 1 records at the torch level: eager steps (the compiled graphs call the same GEMMs)
timeout 150 python train.py $P tuning_stage=1 training.compile=false training.train_iters=2 training.lr_warmup_iters=0 \
  hydra.run.dir=outputs/bench/tune_stage1 > "$OUT/tune_stage1.log" 2>&1; echo "stage 1 rc=$?"
timeout 200 python train.py $P tuning_stage=2 hydra.run.dir=outputs/bench/tune_stage2 > "$OUT/tune_stage2.log" 2>&1
echo "stage 2 rc=$?"; grep -E "speedup|weighted|problems" "$OUT/tune_stage2.log" | tail -5
cp outputs/tune_hipblaslt/llama3_2_1b/gemm_tune/tune_report.md "$OUT/" 2>/dev/null
timeout 240 python bench/e2e.py --suite none --tag gemm_e2e --timeout 75 --log-dir "$LOGS" \
  --extra "default=experiment=llama3_2_1b_megatron_bf16 $M8 training.train_iters=12" \
  --extra "tuned (stage 3)=$P tuning_stage=3 training.train_iters=12" \
  --extra "default again=experiment=llama3_2_1b_megatron_bf16 $M8 training.train_iters=12" > "$OUT/gemm_e2e.log" 2>&1
grep -E "^\| " "$OUT/gemm_e2e.log"
