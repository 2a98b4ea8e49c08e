#!/usr/bin/env bash
# Planner accuracy + the llama2_7b fp8 preset on one GPU + MoE grouped GEMM on/off + determinism, one GPU, ~9 min:
# short runs whose result.json carry torch's max_memory_allocated, then the estimate-vs-measured table.
set -u
S="training.train_iters=4 training.timing_warmup_steps=1 training.lr_warmup_iters=1"
python bench/e2e.py --suite none --timeout 150 \
  --extra "mem megatron=backend=megatron $S" \
  --extra "mem megatron full=backend=megatron recompute=full $S" \
  --extra "mem megatron offload=backend=megatron memory=offload $S" \
  --extra "mem torchtitan=backend=torchtitan $S" \
  --extra "mem torchtitan full AC=backend=torchtitan recompute=full $S" \
  --extra "mem torchtitan selective AC=backend=torchtitan recompute=selective $S" \
  --extra "llama2_7b fp8 1gpu=experiment=llama2_7b_fp8 training.train_iters=6 training.timing_warmup_steps=2" \
  --extra "moe off=experiment=mixtral_small_moe training.train_iters=8" \
  --extra "moe grouped gemm=experiment=mixtral_small_moe moe.moe_grouped_gemm=true training.train_iters=8"
python -m primus.plan.compare outputs/bench/mem_* outputs/bench/llama2_7b_fp8_1gpu outputs/bench/moe_* | tee "${OUT:-.}/memory_compare.md"
python bench/determinism.py | tail -3 | tee "${OUT:-.}/determinism.md"
