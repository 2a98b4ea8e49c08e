#!/usr/bin/env bash
# The cost of observability when profiling is off. Same config (megatron bf16, compile, Llama-3.2-1B shape,
# seq 4096, micro batch 8, 20 steps) with every sink off, then with the defaults (TensorBoard on, profiler hooks
# present but idle), off again (run-to-run noise), and with the profiler recording steps 16-17 (its kernel table
# goes to $OUT/overhead_kernels.md). One GPU, ~6 min:
#   bash bench/observability_overhead.sh     # $OUT/bench_overhead.md/json
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
MEG="backend=megatron training.compile=true"
python bench/e2e.py --suite none --tag overhead --timeout 170 --log-dir "$LOGS" --ref "all off" \
  --extra "all off=$MEG logging.tensorboard=false" \
  --extra "defaults (tensorboard on)=$MEG logging.tensorboard=true" \
  --extra "all off again=$MEG logging.tensorboard=false" \
  --extra "profiler on=$MEG profile.enabled=true profile.start_step=16 profile.steps=2 profile.top_kernels=25"
d=outputs/bench/profiler_on
{ echo "## $d"; cat "$d"/profile/kernels_rank0.md 2>/dev/null || echo "(no kernel table)"; } > "$OUT/overhead_kernels.md"
cat "$OUT/overhead_kernels.md"
