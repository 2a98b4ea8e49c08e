#!/usr/bin/env bash
# What session 2 changed or found and could not check on the H200 (its device time ran out), in one device call:
#  1. the turbo kernel tests on the GPU (incl. the fp8 grouped GEMM and the fp32-weight fp8 linear of TorchTitan)
#     and the fp8 grouped GEMM / RoPE / SwiGLU speed rows;
#  2. the TorchTitan turbo fp8 linear that gave an intermittent NaN gradient norm at step 1 (4 short runs);
#  3. GEMM tuning stage 3 after the routing change (untuned linears stay F.linear; eager Function): is the tuned
#     step no longer slower (session 2: 0.977x)?
#   bash bench/pending_gpu_checks.sh      # logs and tables under $OUT
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
python bench/turbo_kernels.py --only grouped_gemm,qkv_rope,swiglu --budget 200 --test-timeout 150 \
  > "$OUT/pending_kernels.log" 2>&1
grep -E "^\| |pytest on GPU" "$OUT/pending_kernels.log" | tail -20
for i in 1 2 3 4; do
  python train.py experiment=llama3_2_1b_torchtitan_fp8 turbo=torchtitan_fp8 training.train_iters=8 \
    logging.tensorboard=false plan.enforce=false hydra.run.dir=outputs/bench/tt_fp8_turbo_$i > /tmp/tt_fp8_$i.log 2>&1
  echo "torchtitan turbo fp8 run $i: rc=$? $(grep -E '^step +[12]/' /tmp/tt_fp8_$i.log | cut -c1-60 | tr '\n' ' ')"
done | tee "$OUT/pending_tt_fp8.log"
python bench/gemm_tuning.py --max-candidates 64 > "$OUT/pending_gemm.log" 2>&1
grep "^| [0-3] " "$OUT/pending_gemm.log"
