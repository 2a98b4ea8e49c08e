#!/usr/bin/env bash
# Session 3's changes on the H200, one device call (~9.5 min):
#  1. kernels: the flat-rows q/k/v split + RoPE (and its ROWS alternatives), the fused cross entropy; the turbo
#     kernel tests on the GPU (pytest_gpu.log); the fp8 fp32-weight probe (which step fails on the GPU);
#  2. end to end, same call: the compiled reference vs the megatron bf16 / fp8 presets (now with the foreach
#     optimizer kernels and the new RoPE kernel), each with the turbo fused cross entropy (the presets' loss now) and with the compiled torch loss; the bf16
#     preset profiled (kernel table);
#  3. TorchTitan with the turbo fp8 linear, compiled (the intermittent NaN of session 2).
#   bash bench/session3_ab.sh            # $OUT: kernels, probe, e2e table, kernel table, TorchTitan log
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
timeout 160 python bench/turbo_kernels.py --only qkv_rope,cross_entropy --budget 140 --test-timeout 100 \
  --test-files rope,cross_entropy,fp8 \
  > "$OUT/kernels.log" 2>&1
grep -E "^\| (qkv|cross)|pytest on GPU" "$OUT/kernels.log"
timeout 30 python bench/fp8_fp32_weight_probe.py > "$OUT/fp8_probe.log" 2>&1; tail -12 "$OUT/fp8_probe.log"
NOCE="model.cross_entropy_loss_fusion=false model.cross_entropy_fusion_impl=native"
PROF="profile.enabled=true profile.start_step=16 profile.steps=2 profile.top_kernels=40"
timeout 340 python bench/e2e.py --suite reference --only reference/compile_fused --tag s3ab --timeout 85 \
  --log-dir "$LOGS" \
  --extra "megatron bf16=experiment=llama3_2_1b_megatron_bf16 $PROF" \
  --extra "megatron bf16 compiled loss=experiment=llama3_2_1b_megatron_bf16 $NOCE" \
  --extra "megatron fp8=experiment=llama3_2_1b_megatron_fp8" \
  --extra "megatron fp8 compiled loss=experiment=llama3_2_1b_megatron_fp8 $NOCE" > "$OUT/e2e.log" 2>&1
grep -E "^\| " "$OUT/e2e.log"
cp outputs/bench/megatron_bf16/profile/kernels_rank0.md "$OUT/kernels_bf16.md" 2>/dev/null
timeout 60 python train.py experiment=llama3_2_1b_torchtitan_fp8 turbo=torchtitan_fp8 training.train_iters=6 \
  training.lr_warmup_iters=0 logging.tensorboard=false plan.enforce=false hydra.run.dir=outputs/bench/tt_fp8_turbo \
  > "$OUT/tt_fp8.log" 2>&1
echo "torchtitan turbo fp8 compiled: rc=$?"; grep -E "^step +[1-6]/" "$OUT/tt_fp8.log" | cut -c1-80
