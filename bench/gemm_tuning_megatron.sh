#!/usr/bin/env bash
# GEMM tuning on the real step (<= 10 min on one H200): the guide's three stages on the megatron bf16 preset as
# shipped (Llama-3.2-1B shape, seq 4096, micro batch 16, compiled layers), then the tuned and the default step side
# by side in the same run, the default twice to measure noise. "never slower" = tuned within the default runs'
# spread or faster.
#   stage 1  train.py tuning_stage=1: eager steps (the torch-level recorder sees the GEMMs the compiled graphs also
#            run; same shapes), recompute=full so the eager micro batch 16 fits (recompute adds forward calls of
#            the same shapes: the report's weights count them)
#   stage 2  tuning/offline_tune_gemm.py with 32 candidates, up to 10 timed calls each (the lm_head GEMMs of this
#            step take ~50 ms each); resumable: a stopped run continues from its journal
#            when the script is run again
#   stage 3  train.py tuning_stage=3 (tuned shapes through cuBLASLt, under torch.compile)
#   bash bench/gemm_tuning_megatron.sh      # $OUT: stage logs, tune report, gemm_e2e.log
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
P="experiment=llama3_2_1b_megatron_bf16 tuning.enabled=true logging.tensorboard=false"
ROOT=outputs/tune_hipblaslt/llama3_2_1b
timeout 120 python train.py $P tuning_stage=1 training.compile=false recompute=full training.train_iters=1 \
  training.lr_warmup_iters=0 hydra.run.dir=outputs/bench/tune_stage1 > "$OUT/tune_stage1.log" 2>&1
echo "stage 1 rc=$?"; tail -3 "$OUT/tune_stage1.log"
python tuning/offline_tune_gemm.py $ROOT/gemm_shape --list | tail -20
timeout 300 python tuning/offline_tune_gemm.py $ROOT/gemm_shape --max-candidates 32 --iters 10 --warmup 3 \
  --no-progress > "$OUT/tune_stage2.log" 2>&1
echo "stage 2 rc=$?"; tail -25 "$OUT/tune_stage2.log"
cp $ROOT/gemm_tune/tune_report.md "$OUT/" 2>/dev/null
timeout 200 python bench/e2e.py --suite none --tag gemm_e2e --timeout 65 --log-dir "$LOGS" \
  --extra "default=experiment=llama3_2_1b_megatron_bf16 training.train_iters=10" \
  --extra "tuned stage 3=$P tuning_stage=3 training.train_iters=10" \
  --extra "default again=experiment=llama3_2_1b_megatron_bf16 training.train_iters=10" > "$OUT/gemm_e2e.log" 2>&1
grep -E "^\| " "$OUT/gemm_e2e.log"; grep -h "tuned GEMM\|tuning" $LOGS/*tuned* 2>/dev/null | tail -5
