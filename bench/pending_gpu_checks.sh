#!/usr/bin/env bash
# What session 2 changed or found and could not check on the H200, plus the kernel-level profile session 3 works
# from, in one device call (~9 min):
#  1. the kernel-by-kernel profile of the megatron bf16 and fp8 presets (top 60 kernels: which elementwise kernels
#     remain, issue 10);
#  2. the turbo kernel tests on the GPU (incl. the fp8 grouped GEMM and the fp32-weight fp8 linear TorchTitan
#     runs, eager and compiled) and the fp8 grouped GEMM / RoPE / SwiGLU speed rows;
#  3. the TorchTitan turbo fp8 linear that gave an intermittent NaN gradient norm at step 1 (compiled x2, eager x1).
#   bash bench/pending_gpu_checks.sh      # logs and tables under $OUT
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
PROF="training.train_iters=18 profile.enabled=true profile.start_step=14 profile.steps=2 profile.top_kernels=60"
for p in bf16 fp8; do
  timeout 150 python train.py experiment=llama3_2_1b_megatron_$p $PROF logging.tensorboard=false \
    hydra.run.dir=outputs/bench/prof_$p > /tmp/prof_$p.log 2>&1
  echo "## megatron $p (rc=$?)"; grep -E "^step +1[0-8]/" /tmp/prof_$p.log | tail -2
  cat outputs/bench/prof_$p/profile/kernels_rank0.md 2>/dev/null || tail -20 /tmp/prof_$p.log
done > "$OUT/pending_profile.md" 2>&1
timeout 200 python bench/turbo_kernels.py --only grouped_gemm,qkv_rope,swiglu --budget 190 --test-timeout 150 \
  > "$OUT/pending_kernels.log" 2>&1
grep -E "^\| |pytest on GPU" "$OUT/pending_kernels.log" | tail -20
for mode in compile compile eager; do
  c=$([ $mode = compile ] && echo true || echo false)
  timeout 90 python train.py experiment=llama3_2_1b_torchtitan_fp8 turbo=torchtitan_fp8 training.train_iters=6 training.lr_warmup_iters=0 \
    training.compile=$c logging.tensorboard=false plan.enforce=false hydra.run.dir=outputs/bench/tt_fp8_turbo \
    > /tmp/tt_fp8.log 2>&1
  echo "torchtitan turbo fp8 $mode: rc=$? $(grep -E '^step +[1-3]/' /tmp/tt_fp8.log | cut -c1-70 | tr '\n' ' ')"
  grep -iE "nan|non-finite" /tmp/tt_fp8.log | head -3
done | tee "$OUT/pending_tt_fp8.log"
