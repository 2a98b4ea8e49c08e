#!/usr/bin/env bash
# Session 10's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
# Calls 1-3 (cases 1-2 and `python bench/side_casts_probe.py`) ran on commit 477901c, the side-stream experiment,
# reverted after them (docs/benchmarks.md, session 10); run them from that commit.
#   bash bench/session10.sh 1   # the fp8 linear's wgrad casts on a side stream vs in line (bench/side_casts_probe.py),
#                               # then test_turbo_fp8.py on the GPU (side-stream bytes == in-line bytes)
#   bash bench/session10.sh 2   # the same probe with the side casts' outputs from the caller's pool, each variant
#                               # timed twice; the side-stream tests
#   bash bench/session10.sh 3 BASE   # the delayed cast with its scale from the amax pass's last program (no
#                               # one-program kernel between) vs BASE's fp8_linear.py; delayed / tensorwise GPU tests
#   bash bench/session10.sh 4 BASE   # the delayed cast as one kernel per call (the last program computes the next
#                               # call's scale) vs BASE's; its kernels; the delayed / tensorwise GPU tests
#   bash bench/session10.sh 5 BASE   # the megatron delayed preset end to end, this tree vs BASE's fp8_linear.py
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
F=primus/turbo/fp8_linear.py
use() {  # $1: after | BASE dir: put that fp8_linear.py in place (this tree's is kept in /tmp first)
  [ -f /tmp/fp8_linear_after.py ] || cp $F /tmp/fp8_linear_after.py
  if [ "$1" = after ]; then cp /tmp/fp8_linear_after.py $F; else cp "$1/fp8_linear.py" $F; fi
}
case "${1:-}" in
  1) timeout 240 python bench/side_casts_probe.py > "$OUT/side_probe.log" 2>&1
     grep -E "^\||Error|error" "$OUT/side_probe.log" | tail -40
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py > "$OUT/pytest_gpu1.log" 2>&1
     tail -5 "$OUT/pytest_gpu1.log" ;;
  2) timeout 400 python bench/side_casts_probe.py > "$OUT/side_probe2.log" 2>&1
     grep -E "^\||Error|error" "$OUT/side_probe2.log" | tail -60
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py -k side > "$OUT/pytest_gpu2.log" 2>&1
     tail -3 "$OUT/pytest_gpu2.log" ;;
  3) BASE=${2:?usage: session10.sh 3 BASELINE_DIR}
     timeout 200 python bench/delayed_cast_probe.py --baseline "$BASE/fp8_linear.py" > "$OUT/delayed_probe.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/delayed_probe.log" | tail -30
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py tests/test_torchtitan_turbo.py -k "delayed or recompute or tensorwise or custom_ops" \
       > "$OUT/pytest_gpu3.log" 2>&1
     tail -3 "$OUT/pytest_gpu3.log" ;;
  4) BASE=${2:?usage: session10.sh 4 BASELINE_DIR}
     timeout 150 python bench/delayed_cast_probe.py --baseline "$BASE/fp8_linear.py" --parts 1024 \
       > "$OUT/delayed_probe.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/delayed_probe.log" | tail -30
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py tests/test_torchtitan_turbo.py -k "delayed or recompute or tensorwise or custom_ops" \
       > "$OUT/pytest_gpu4.log" 2>&1
     tail -3 "$OUT/pytest_gpu4.log" ;;
  5) BASE=${2:?usage: session10.sh 5 BASELINE_DIR}
     B="experiment=llama3_2_1b_megatron_fp8_delayed training.train_iters=14"
     timeout 260 python bench/e2e.py --suite none --tag dl_after --timeout 240 --log-dir /tmp/bench_logs \
       --ref "delayed after" --extra "delayed after=$B" > "$OUT/dl_after.log" 2>&1
     grep -E "^\| " "$OUT/dl_after.log"
     use "$BASE"
     timeout $((590 - SECONDS)) python bench/e2e.py --suite none --tag dl_before --timeout 240 \
       --log-dir /tmp/bench_logs --ref "delayed before" --extra "delayed before=$B" > "$OUT/dl_before.log" 2>&1
     grep -E "^\| " "$OUT/dl_before.log"
     use after ;;
  *) echo "usage: bash bench/session10.sh 1" >&2; exit 2 ;;
esac
