#!/usr/bin/env bash
# Session 4, one device call (<= 600 s): the fp8 delayed-scaling preset against the tensorwise one and the float8
# reference (issue 10), the bf16 preset against the compiled reference, the fp8 kernel tests on the GPU; then
# issue 6's stage 1 + the rest of stage 2 on the megatron bf16 preset (resumable: the journal of earlier calls may
# be carried in outputs/tune_hipblaslt), with whatever time is left.
#   bash bench/session4.sh      # $OUT: e2e.log, bench_session4.md/json, pytest_gpu.log, tune logs and report
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
T0=$(date +%s)
timeout 60 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
  > "$OUT/pytest_gpu.log" 2>&1
tail -2 "$OUT/pytest_gpu.log"
timeout 400 python bench/e2e.py --suite reference --only reference/compile_fused reference/float8 --tag session4 \
  --timeout 95 --log-dir "$LOGS" \
  --extra "megatron bf16 preset=experiment=llama3_2_1b_megatron_bf16" \
  --extra "megatron fp8 tensorwise preset=experiment=llama3_2_1b_megatron_fp8" \
  --extra "megatron fp8 delayed preset=experiment=llama3_2_1b_megatron_fp8_delayed" \
  --extra "torchtitan bf16 preset=experiment=llama3_2_1b_torchtitan_bf16" \
  > "$OUT/e2e.log" 2>&1
grep -E "^\| " "$OUT/e2e.log"
grep -h "^step " "$LOGS"/*delayed* 2>/dev/null | cut -c1-100 | head -20 > "$OUT/delayed_steps.log"
head -4 "$OUT/delayed_steps.log"
ROOT=outputs/tune_hipblaslt/llama3_2_1b
P="experiment=llama3_2_1b_megatron_bf16 tuning.enabled=true logging.tensorboard=false"
LEFT=$(( 585 - ($(date +%s) - T0) ))
if [ "$LEFT" -gt 100 ]; then
  timeout 90 python train.py $P tuning_stage=1 training.compile=false recompute=full training.train_iters=1 \
    training.lr_warmup_iters=0 hydra.run.dir=outputs/bench/tune_stage1 > "$OUT/tune_stage1.log" 2>&1
  echo "stage 1 rc=$?"
  LEFT=$(( 585 - ($(date +%s) - T0) ))
  timeout $LEFT python tuning/offline_tune_gemm.py $ROOT/gemm_shape --max-candidates 32 --iters 10 --warmup 3 \
    --retry-failed --no-progress > "$OUT/tune_stage2.log" 2>&1
  echo "stage 2 rc=$?"; tail -22 "$OUT/tune_stage2.log"
fi
# one archive (the device returns at most 8 files): stage logs, shape dump, results, journal, report
tar czf "$OUT/tune.tgz" "$OUT"/tune_stage*.log $ROOT/gemm_shape $ROOT/gemm_tune 2>/dev/null
rm -f "$OUT"/tune_stage*.log
