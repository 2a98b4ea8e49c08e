#!/usr/bin/env bash
# Where the step time goes: the compiled reference, megatron bf16/fp8 and TorchTitan bf16 at
# the bench shape (Llama-3.2-1B, seq 4096, micro batch 8), the profiled points with the profiler's kernel-category
# table (profile.start_step=16, 2 steps) and megatron's with a CUDA memory snapshot. One GPU, ~8 min:
#   bash bench/where_time_goes.sh        # writes $OUT/bench_where.md/json and $OUT/kernels.md
set -u
OUT=${OUT:-outputs/bench}
LOGS=${LOGS:-/tmp/bench_logs}
mkdir -p "$OUT" "$LOGS"
PROF="profile.enabled=true profile.start_step=16 profile.steps=2 profile.top_kernels=25"
MEG="backend=megatron training.compile=true"
python bench/e2e.py --suite reference --only reference/compile_fused --tag where --timeout 170 --log-dir "$LOGS" \
  --extra "megatron bf16 compile=$MEG" \
  --extra "megatron fp8 compile turbo-attn=$MEG precision=fp8 turbo=megatron turbo.use_turbo_rms_norm=false turbo.use_turbo_parallel_linear=false" \
  --extra "megatron bf16 compile profiled=$MEG $PROF profile.memory_snapshot=true" \
  --extra "torchtitan bf16 compile profiled=backend=torchtitan training.compile=true $PROF"
{
  for d in outputs/bench/*profiled; do
    echo "## $d"; cat "$d"/profile/kernels_rank0.md 2>/dev/null || echo "(no kernel table)"
    ls -la "$d"/profile 2>/dev/null
    python - "$d" <<'PY'
import glob, pickle, sys
for p in glob.glob(sys.argv[1] + "/profile/memory_snapshot*.pickle"):
    snap = pickle.load(open(p, "rb"))
    segs = snap.get("segments", [])
    traces = sum(len(t) for t in snap.get("device_traces", []))
    print(f"memory snapshot {p}: {len(segs)} segments, {traces} allocator events, "
          f"{sum(s['total_size'] for s in segs) / 2**30:.1f} GiB reserved")
PY
  done
} > "$OUT/kernels.md" 2>&1
cat "$OUT/kernels.md"
