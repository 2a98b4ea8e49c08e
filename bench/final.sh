#!/usr/bin/env bash
# Issue 10's comparison in one device call: the plain-PyTorch reference (compiled + fused AdamW; + torchao float8)
# and both backends at their best settings, same model (Llama-3.2-1B shape, seq 4096, micro batch 8).
set -u
python bench/e2e.py --suite core --timeout 150 \
  --only "reference/compile_fused" "reference/float8" "torchtitan bf16 compile" "torchtitan fp8 compile" \
  --extra "megatron bf16 compile turbo-attn=backend=megatron training.compile=true turbo=megatron turbo.use_turbo_rms_norm=false turbo.use_turbo_parallel_linear=false" \
  --extra "megatron fp8 compile turbo-attn=backend=megatron precision=fp8 training.compile=true turbo=megatron turbo.use_turbo_rms_norm=false turbo.use_turbo_parallel_linear=false" \
  --extra "torchtitan fp8 compile turbo-fp8=backend=torchtitan training.compile=true precision=fp8 turbo=torchtitan_fp8" \
  --extra "megatron bf16 compile=backend=megatron training.compile=true"
